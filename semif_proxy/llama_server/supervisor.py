"""Supervision of one llama-server child (the server starts one, or two under CPU sharing
dynamic): start, probe, restart, stop.

A probe that succeeds makes the child healthy again; `unhealthy_after` failed probes in a row
make it unhealthy; `max_failed_probes` in a row (a stalled or wedged child) get it killed and
restarted; an exit gets it restarted with exponential backoff. Its output is read without pause,
whatever its line lengths, so the pipe can never fill and block it (child.py: the process itself,
spawned, drained and ended).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from semif_proxy.llama_server import child
from semif_proxy.settings import (
    LLAMA_BACKOFF_INITIAL_S,
    LLAMA_BACKOFF_MAX_S,
    LLAMA_UNHEALTHY_AFTER,
    Settings,
)

log = logging.getLogger("semif_proxy.llama_server")


class LlamaServerError(RuntimeError):
    pass


def _default(name: str) -> float:
    return Settings.model_fields[name].default


@dataclass(frozen=True)
class Supervision:
    """How the child is watched; the defaults are the settings' (settings/defaults.py). They fit
    SageMaker: start-up may take minutes for a big model (the platform allows up to 600 s), a
    stall is noticed within seconds."""

    start_timeout: float = _default("llama_server_start_timeout")
    probe_interval: float = _default("health_interval")
    probe_timeout: float = _default("health_timeout")
    unhealthy_after: int = LLAMA_UNHEALTHY_AFTER
    max_failed_probes: int = int(_default("max_failed_probes"))
    backoff_initial: float = LLAMA_BACKOFF_INITIAL_S
    backoff_max: float = LLAMA_BACKOFF_MAX_S


class LlamaServer:
    """One llama-server on loopback, probed and restarted while the proxy runs."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        port: int,
        extra_args: Sequence[str] = (),
        supervision: Supervision | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.binary = binary
        self.model = model
        self.port = port
        self.host = host
        self.extra_args = list(extra_args)
        self.supervision = supervision or Supervision()
        self.restarts = 0
        self.unresponsive_kills = 0
        self.failed_probes = 0
        self.output_lines_cut = 0
        self.state = "stopped"
        self.process: asyncio.subprocess.Process | None = None
        self._healthy = asyncio.Event()
        self._stopping = False
        self._supervisor: asyncio.Task[None] | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process and self.process.returncode is None else None

    @property
    def answering(self) -> bool:
        """Healthy, and its last probe passed: one miss leaves chat open (see `unhealthy_after`),
        but dynamic CPU sharing routes no chat to a second child that may be stalled."""
        return self.healthy and self.failed_probes == 0

    @property
    def healthy(self) -> bool:
        return self._healthy.is_set()

    async def until_healthy(self) -> None:
        """Returns once the child answers its probes (at once when it does now)."""
        await self._healthy.wait()

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

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the child and wait until /health answers 200 (fail fast if it dies)."""
        self._stopping = False
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.supervision.probe_timeout)
        )
        started = time.monotonic()
        try:
            await self._spawn()
            await self._wait_healthy()
        except BaseException:
            await self.stop()
            raise
        log.info(
            "llama-server ready",
            extra={
                "event": "llama_server_ready",
                "port": self.port,
                "seconds": round(time.monotonic() - started, 3),
            },
        )
        self._supervisor = asyncio.create_task(self._supervise(), name="llama-server-supervisor")

    async def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self.state = "stopping"
        self._healthy.clear()  # no chat is routed to a child that is being stopped
        if self._supervisor:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        await self._terminate(timeout)
        if self._session:
            await self._session.close()
        self._healthy.clear()
        self.state = "stopped"

    async def _terminate(self, timeout: float) -> None:
        if self.process:
            await child.terminate(self.process, timeout)
        if self._pump_task:
            # The pump ends by itself at EOF; give it a moment to log the child's last words.
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._pump_task, 2.0)

    async def _spawn(self) -> None:
        if not self.binary.is_file():
            raise LlamaServerError(f"llama-server binary not found at {self.binary}")
        self.state = "starting"
        self._healthy.clear()
        self.failed_probes = 0
        self.process = await child.spawn(self.argv())
        log.info(
            "llama-server started",
            extra={"event": "llama_server_start", "pid": self.process.pid, "argv": self.argv()},
        )
        self._pump_task = asyncio.create_task(
            child.pump(self.process, self._count_cut_line), name="llama-server-output"
        )

    def _count_cut_line(self) -> None:
        self.output_lines_cut += 1

    # -- health ------------------------------------------------------------------------------------

    async def _probe(self) -> bool:
        assert self._session is not None
        try:
            async with self._session.get(f"{self.base_url}/health") as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def _wait_healthy(self) -> None:
        timeout = self.supervision.start_timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.returncode is not None:
                code = self.process.returncode if self.process else None
                raise LlamaServerError(f"llama-server exited with code {code} during start-up")
            if await self._probe():
                self._mark_healthy()
                return
            await asyncio.sleep(0.1)
        raise LlamaServerError(
            f"llama-server not healthy after {timeout:g}s (SEMIF_LLAMA_SERVER_START_TIMEOUT)"
        )

    def _mark_healthy(self) -> None:
        if not self.healthy and self.state == "unresponsive":
            log.info(
                "llama-server answers again",
                extra={"event": "llama_server_recovered", "failed_probes": self.failed_probes},
            )
        self.failed_probes = 0
        self.state = "ready"
        self._healthy.set()

    async def _supervise(self) -> None:
        backoff = self.supervision.backoff_initial
        while not self._stopping:
            assert self.process is not None
            await self._watch(self.process)
            if self._stopping:
                return
            self._healthy.clear()
            self.state = "restarting"
            log.warning(
                "llama-server exited; restarting",
                extra={
                    "event": "llama_server_exit",
                    "code": self.process.returncode,
                    "backoff": backoff,
                },
            )
            await asyncio.sleep(backoff)
            try:
                await self._spawn()
                await self._wait_healthy()
                self.restarts += 1
                backoff = self.supervision.backoff_initial
            except (LlamaServerError, OSError) as exc:
                log.error(
                    "llama-server restart failed",
                    extra={"event": "llama_server_restart_failed", "error": str(exc)},
                )
                if self.process and self.process.returncode is None:
                    self.process.kill()
                    await self.process.wait()
                backoff = min(backoff * 2, self.supervision.backoff_max)

    async def _watch(self, process: asyncio.subprocess.Process) -> None:
        """Probe the running child until it exits, or until it has failed so many probes in a
        row that it is killed."""
        exit_wait = asyncio.ensure_future(process.wait())
        try:
            while True:
                done, _ = await asyncio.wait({exit_wait}, timeout=self.supervision.probe_interval)
                if done:
                    return
                if await self._probe():
                    self._mark_healthy()
                    continue
                self.failed_probes += 1
                # Never killed while still counted healthy (SEMIF_MAX_FAILED_PROBES may be 1).
                if self.failed_probes >= min(
                    self.supervision.unhealthy_after, self.supervision.max_failed_probes
                ):
                    self._healthy.clear()
                    if self.state != "unresponsive":
                        log.warning(
                            "llama-server does not answer /health",
                            extra={
                                "event": "llama_server_unresponsive",
                                "pid": process.pid,
                                "failed_probes": self.failed_probes,
                            },
                        )
                    self.state = "unresponsive"
                else:
                    log.debug(
                        "llama-server missed a probe",
                        extra={"event": "llama_server_probe_missed", "pid": process.pid},
                    )
                if self.failed_probes >= self.supervision.max_failed_probes:
                    log.error(
                        "llama-server unresponsive; killing it to restart",
                        extra={
                            "event": "llama_server_killed",
                            "pid": process.pid,
                            "failed_probes": self.failed_probes,
                        },
                    )
                    self.unresponsive_kills += 1
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()  # SIGKILL also ends a stopped process
                    await exit_wait
                    return
        finally:
            if not exit_wait.done():
                exit_wait.cancel()
