"""A ServerProcess-style wrapper: the real `semif-proxy serve` on free loopback ports, with a
timeout on every call. The tests and the benchmarks drive the server through it."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _binds(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range. A port bind(0) hands out lies
    in that range, where any outgoing connection may take it before the server binds it: the
    proxy opens one per upstream call, and its second llama-server binds seconds after the
    engine loads (a test failed so: "couldn't bind HTTP server socket")."""
    floor = _ephemeral_floor()
    low = min(10_000, floor // 2)
    for _ in range(1000):
        port = random.randrange(low, floor)
        if _binds(port):
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 between {low} and {floor}")


def free_port_pair(avoid: int = 0) -> int:
    """A free port whose next one up is free too (SEMIF_CPU_SHARING=dynamic's second
    llama-server takes it)."""
    for _ in range(100):
        port = free_port()
        if avoid in (port, port + 1) or port + 1 >= _ephemeral_floor() or not _binds(port + 1):
            continue
        return port
    raise RuntimeError("no two free ports in a row on 127.0.0.1")


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll check() until it holds; seconds it took. Fails (AssertionError) after timeout: wait
    on the event itself with a generous deadline rather than sleep for a guessed time."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"timed out after {timeout}s: {what}"
        time.sleep(0.05)
    return time.monotonic() - start


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


# The settings tests and benchmarks start servers with, by name (on top of the loopback ports,
# the 4,096-token context and the one thread every test server gets; None removes a variable).
PRESETS: dict[str, dict[str, str | None]] = {
    "full": {},  # chat and decisions
    "decisions": {"SEMIF_CHAT": "off"},  # no llama-server: faster to start, nothing to stall
    # The product's own defaults for threads and llama-server slots (CPU sharing as deployed).
    "defaults": {"SEMIF_THREADS": None, "SM_LLAMA_CPP_PARALLEL": None},
}


def _refusal(reply: Reply | None) -> str | None:
    """The engine's reason when /ping says it refuses this model, else None."""
    if reply is None or reply.status != 503:
        return None
    try:
        engine = json.loads(reply.body).get("engine")
    except (ValueError, AttributeError):
        return None
    if not isinstance(engine, dict) or engine.get("state") != "refusing":
        return None
    return str(engine.get("reason"))


class ProxyProcess:
    def __init__(
        self,
        model: Path | None,
        env: dict[str, str | None] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.upstream_port = free_port_pair(avoid=self.port)
        self.model = model
        self.env = {
            **os.environ,
            "SM_LLAMA_CPP_PORT": str(self.port),
            "LLAMA_CPP_UPSTREAM_PORT": str(self.upstream_port),
            "SEMIF_HOST": "127.0.0.1",
            "SM_LLAMA_CPP_CTX_SIZE": "4096",
            "SM_LLAMA_CPP_PARALLEL": "2",
            "SEMIF_THREADS": "1",
            "SEMIF_N_GPU_LAYERS": os.environ.get("SEMIF_TEST_GPU_LAYERS", "0"),
            **(env or {}),
        }
        # None in `env` removes a variable (e.g. SEMIF_THREADS, to run with the defaults).
        self.env = {k: v for k, v in self.env.items() if v is not None}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        # What is started; a test may swap in the container's entrypoint with the platform's argv.
        self.command = [sys.executable, "-m", "semif_proxy.cli", "serve"] + (
            ["--model", str(model)] if model else []
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> ProxyProcess:
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> ProxyProcess:
        out = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if out is not subprocess.DEVNULL:
            out.close()  # the child holds its own copy
        return self

    def wait_ready(self, timeout: float = 120.0) -> ProxyProcess:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"semif-proxy exited with {self.proc.returncode} at start")
            try:
                reply = self.call("GET", "/ping", timeout=2)
            except OSError:
                reply = None
            if reply is not None and reply.status == 200:
                return self
            refusing = _refusal(reply)
            if refusing:
                # Final: the engine has decided (e.g. its exactness self-check failed), and
                # waiting out the timeout would only hide why.
                self.stop()
                raise RuntimeError(f"semif-proxy refuses decisions: {refusing}")
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("semif-proxy did not become ready")

    def log_lines(self) -> list[str]:
        """The JSON lines the server has logged so far (needs log_path)."""
        assert self.log_path is not None, "start the server with a log_path"
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return [line for line in text.splitlines() if line.startswith("{")]

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60.0,
        raw: bytes | None = None,
    ) -> Reply:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, headers=hdrs, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return Reply(resp.status, dict(resp.headers), resp.read())
        except urllib.error.HTTPError as err:
            return Reply(err.code, dict(err.headers), err.read())

    def metric(self, name: str) -> float:
        """The value of one unlabelled series in GET /metrics (e.g. semif_engine_job_running)."""
        text = self.call("GET", "/metrics", timeout=10).body.decode()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(f"{name} not in /metrics")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode
