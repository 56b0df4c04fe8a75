"""Time-slicing the CPU between the engine and llama-server while both have work.

Both processes run with every core. While only one kind of work is in flight (decisions, or
chat calls) it runs alone at full speed, as with the gate. While both are, they take turns, a
round (SEMIF_CPU_SLICE_MS, 400 ms) at a time, llama-server's part of it SEMIF_CPU_CHAT_SHARE
(0.5): on the engine's turn llama-server is stopped (SIGSTOP); on llama-server's the engine's
job is parked at its next graph node (DecisionEngine.pause) and llama-server is continued
(SIGCONT). So neither waits for the other's whole job, as at the gate (a chat there waits for
the decision in progress, seconds on a long prompt), and neither runs on half the cores, as
with the split.

Why signals and not fewer threads: ggml's compute threads wait for each other at every graph
node, spinning; two processes that both spin on the same cores slow each other down many times
over (the `none` design in bench `mixed`), and llama-server's thread count is fixed when it
starts. A stopped process spins on nothing.

What keeps llama-server from staying stopped: it is continued at the end of every engine turn,
when either kind of work ends, when the slicer closes, and before the supervisor signals it
(LlamaServer._terminate); a turn starts only while the supervisor counts it healthy and its
last probe passed (a health probe then waits at most one engine turn; settings refuse a
SEMIF_HEALTH_TIMEOUT shorter than that); and it dies with the proxy by SIGKILL, which ends a
stopped process too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

from semif_proxy.cpu_gate import CpuGate

log = logging.getLogger("semif_proxy.cpu")


class Pausable(Protocol):
    @property
    def parks_quietly(self) -> bool: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...


class Stoppable(Protocol):
    @property
    def pid(self) -> int | None: ...
    @property
    def answering(self) -> bool: ...


def process_state(pid: int) -> str | None:
    """The state letter in /proc/<pid>/stat (T: stopped by a signal, Z: a zombie); None when
    there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def process_stopped(pid: int) -> bool:
    return process_state(pid) == "T"


class CpuSlicer:
    """The CPU gate's interface (exclusive: a decision; shared: a chat call), but nothing
    waits: both kinds are admitted, and the slicer takes turns between them while both run.
    A round of `round_s` gives llama-server `chat_share` of it and the engine the rest."""

    def __init__(self, round_s: float = 0.4, chat_share: float = 0.5) -> None:
        self.enabled = True
        self.turn_s = {"server": round_s * chat_share, "engine": round_s * (1 - chat_share)}
        self.in_flight = {"engine": 0, "server": 0}  # decisions, chat calls
        self.turns = 0  # turns handed over while both ran
        self._engine: Pausable | None = None
        self._server: Stoppable | None = None
        self._stopped_pid: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._ended = asyncio.Event()  # one kind of work ended: stop taking turns at once
        # Where a parked engine's other threads would spin (no OpenMP), the gate's
        # one-job-at-a-time takes over. Decided when the engine has loaded: chat calls that
        # entered before then finish outside the gate (a start-up moment, nothing lost).
        self.fallback: CpuGate | None = None
        self._closed = False

    @property
    def waiting(self) -> int:
        return self.fallback.waiting if self.fallback else 0

    @property
    def waits(self) -> int:
        return self.fallback.waits if self.fallback else 0

    def attach(self, engine: Pausable | None = None, server: Stoppable | None = None) -> None:
        if engine is not None:
            if not engine.parks_quietly:
                log.warning(
                    "ggml's CPU backend has no OpenMP: a parked engine's threads would spin, "
                    "so the CPU is shared by the gate (one job at a time) instead of slices",
                    extra={"event": "cpu_slicer_fallback"},
                )
                self.fallback = CpuGate()
            self._engine = engine
        if server is not None:
            self._server = server

    def exclusive(self, timeout: float | None = None) -> AbstractAsyncContextManager[None]:
        """A decision's engine job."""
        if self.fallback is not None:
            return self.fallback.exclusive(timeout)
        return self._in_flight("engine")

    def shared(self, timeout: float | None = None) -> AbstractAsyncContextManager[None]:
        """A chat call to llama-server."""
        if self.fallback is not None:
            return self.fallback.shared(timeout)
        return self._in_flight("server")

    @contextlib.asynccontextmanager
    async def _in_flight(self, kind: str) -> AsyncIterator[None]:
        self.in_flight[kind] += 1
        self._changed(newcomer=kind)
        try:
            yield
        finally:
            self.in_flight[kind] -= 1
            self._changed()

    @property
    def both(self) -> bool:
        return self.in_flight["engine"] > 0 and self.in_flight["server"] > 0

    def _changed(self, newcomer: str | None = None) -> None:
        if not self.both:
            self._ended.set()
            self._release()  # now, not at the end of the turn in progress
        elif not self._closed and (self._task is None or self._task.done()):
            # The newcomer's turn first: a chat that arrives during a decision gets its
            # first token without waiting out the decision's turn.
            self._task = asyncio.create_task(
                self._alternate(newcomer or "server"), name="cpu-slicer"
            )

    async def _alternate(self, first: str) -> None:
        turn = first
        try:
            while self.both and self._engine is not None:
                self._ended.clear()
                if turn == "engine":
                    self._stop_server()
                    self._engine.resume()
                else:
                    if self._server_may_run():
                        self._engine.pause()
                    else:  # restarting or stalled: its turn would be lost
                        self._engine.resume()
                    self._continue_server()
                self.turns += 1
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._ended.wait(), self.turn_s[turn])
                turn = "server" if turn == "engine" else "engine"
        except Exception:
            log.exception("CPU slicer failed; both run unsliced", extra={"event": "cpu_slicer"})
        finally:
            self._release()

    def _release(self) -> None:
        if self._engine is not None:
            self._engine.resume()
        self._continue_server()

    def _server_may_run(self) -> bool:
        server = self._server
        return server is not None and server.answering and server.pid is not None

    def _stop_server(self) -> None:
        server = self._server
        if server is None or server.pid is None or not self._server_may_run():
            return  # starting, restarting, stopping or gone: not while the supervisor acts
        if process_stopped(server.pid):
            return  # stopped by someone else: not ours to continue
        try:
            os.kill(server.pid, signal.SIGSTOP)
            self._stopped_pid = server.pid
        except ProcessLookupError:
            self._stopped_pid = None

    def _continue_server(self) -> None:
        pid, self._stopped_pid = self._stopped_pid, None
        if pid is None or self._server is None or self._server.pid != pid:
            return  # gone (the supervisor's SIGKILL ends a stopped child): the pid may be reused
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._release()
