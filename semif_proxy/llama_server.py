"""Supervision of the llama-server child: start, health-poll, restart with backoff, stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

log = logging.getLogger("semif_proxy.llama_server")
child_log = logging.getLogger("semif_proxy.llama_server.output")


class LlamaServerError(RuntimeError):
    pass


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM when the proxy dies, even by SIGKILL; no orphans.
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except OSError:
        pass


class LlamaServer:
    """One llama-server on loopback, restarted with exponential backoff whenever it exits."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        port: int,
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        start_timeout: float = 120.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        self.binary = binary
        self.model = model
        self.port = port
        self.host = host
        self.extra_args = list(extra_args)
        self.start_timeout = start_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.restarts = 0
        self.state = "stopped"
        self.process: asyncio.subprocess.Process | None = None
        self._healthy = asyncio.Event()
        self._stopping = False
        self._supervisor: asyncio.Task[None] | None = None
        self._pumps: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process and self.process.returncode is None else None

    @property
    def healthy(self) -> bool:
        return self._healthy.is_set()

    def argv(self) -> list[str]:
        args = [
            str(self.binary),
            "--model",
            str(self.model),
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]
        return args + self.extra_args

    async def start(self) -> None:
        """Start the child and wait until /health answers 200 (fail fast if it dies)."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        await self._spawn()
        try:
            await self._wait_healthy(self.start_timeout)
        except BaseException:
            await self.stop()
            raise
        self._supervisor = asyncio.create_task(self._supervise(), name="llama-server-supervisor")

    async def _spawn(self) -> None:
        if not self.binary.is_file():
            raise LlamaServerError(f"llama-server binary not found at {self.binary}")
        self.state = "starting"
        self._healthy.clear()
        self.process = await asyncio.create_subprocess_exec(
            *self.argv(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            env={**os.environ},
        )
        log.info(
            "llama-server started",
            extra={"event": "llama_server_start", "pid": self.process.pid, "argv": self.argv()},
        )
        self._pumps = [asyncio.create_task(self._pump(self.process))]

    async def _pump(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                child_log.info(line, extra={"source": "llama-server", "pid": process.pid})

    async def _health_ok(self) -> bool:
        assert self._session is not None
        try:
            async with self._session.get(f"{self.base_url}/health") as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.returncode is not None:
                code = self.process.returncode if self.process else None
                raise LlamaServerError(f"llama-server exited with code {code} during start-up")
            if await self._health_ok():
                self.state = "ready"
                self._healthy.set()
                return
            await asyncio.sleep(0.1)
        raise LlamaServerError(f"llama-server not healthy after {timeout:.0f}s")

    async def _supervise(self) -> None:
        backoff = self.backoff_initial
        while not self._stopping:
            assert self.process is not None
            code = await self.process.wait()
            self._healthy.clear()
            if self._stopping:
                return
            self.state = "restarting"
            log.warning(
                "llama-server exited; restarting",
                extra={"event": "llama_server_exit", "code": code, "backoff": backoff},
            )
            await asyncio.sleep(backoff)
            try:
                await self._spawn()
                await self._wait_healthy(self.start_timeout)
                self.restarts += 1
                backoff = self.backoff_initial
            except (LlamaServerError, OSError) as exc:
                log.error(
                    "llama-server restart failed",
                    extra={"event": "llama_server_restart_failed", "error": str(exc)},
                )
                if self.process and self.process.returncode is None:
                    self.process.kill()
                backoff = min(backoff * 2, self.backoff_max)

    async def check(self) -> bool:
        """Live health: the child answers /health right now."""
        if not self.healthy:
            return False
        ok = await self._health_ok()
        if not ok:
            self._healthy.clear()
        return ok

    async def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self.state = "stopping"
        if self._supervisor:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        proc = self.process
        if proc and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        for pump in self._pumps:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        if self._session:
            await self._session.close()
        self._healthy.clear()
        self.state = "stopped"
