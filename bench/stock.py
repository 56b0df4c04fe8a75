"""A stock llama-server for the benchmarks to measure the proxy against: the llama-server binary
the proxy would run (SEMIF_LLAMA_SERVER, the bundled one, or PATH), started on its own with
llama.cpp's defaults but for the port, the context, the slots, the threads (every core, as the
proxy gives its llama-server; llama.cpp's own default counts physical cores only) and the
weight layout: `repack` (llama.cpp's default) or `no-repack` (--no-repack).

    with StockServer(model, "no-repack", parallel=4) as stock:
        post(stock.url + "/completion", {...})
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from semif_proxy.testing.server import free_port

# The two weight layouts, by the llama-server flag that picks each.
LAYOUTS = ("repack", "no-repack")


def layout_of(on: bool) -> str:
    return LAYOUTS[0] if on else LAYOUTS[1]


def binary() -> Path:
    from semif_proxy.engine import native

    configured = os.environ.get("SEMIF_LLAMA_SERVER")
    found = native.llama_server_path(Path(configured) if configured else None)
    if found is None:
        raise RuntimeError("no llama-server (bundled, SEMIF_LLAMA_SERVER or PATH)")
    return found


class StockServer:
    def __init__(
        self,
        model: Path,
        layout: str,
        parallel: int = 1,
        ctx: int = 8192,
        threads: int | None = None,
        log_path: Path | None = None,
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r}: one of {LAYOUTS}")
        self.layout = layout
        self.port = free_port()
        self.log_path = log_path
        self.argv = [
            str(binary()),
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--ctx-size",
            str(ctx),
            "--parallel",
            str(parallel),
            "--threads",
            str(threads or os.cpu_count() or 1),
            "--n-gpu-layers",
            os.environ.get("SEMIF_TEST_GPU_LAYERS", "0"),
            *(["--no-repack"] if layout == "no-repack" else []),
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def describe(self) -> dict[str, Any]:
        """What ran, for the results file (the binary's path left out: it names this host)."""
        return {"layout": self.layout, "argv": [Path(self.argv[0]).name, *self.argv[1:]]}

    def start(self, timeout: float = 900.0) -> StockServer:
        out = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        if out is not subprocess.DEVNULL:
            out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"llama-server ({self.layout}) exited with {self.proc.returncode}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass  # 503 while the model loads
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server ({self.layout}) not healthy within {timeout:g} s")

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> StockServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
