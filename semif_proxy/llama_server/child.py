"""The llama-server child as a process: spawned so that it dies with the proxy, its output read
without pause and logged line by line, and ended within a bounded time. When to start, probe and
restart it is supervisor.py's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable

from semif_proxy.llama_server.output import LineReader

log = logging.getLogger("semif_proxy.llama_server")
child_log = logging.getLogger("semif_proxy.llama_server.output")

READ_CHUNK = 64 * 1024


def die_with_parent() -> None:
    # Linux: the child is killed when the proxy dies, even by SIGKILL; no orphans. SIGKILL,
    # because a child the CPU slicer has just stopped would act on SIGTERM only once continued.
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        pass


async def spawn(argv: list[str]) -> asyncio.subprocess.Process:
    """The child, its stdout and stderr on one pipe (read it with `pump`), killed if the proxy
    dies."""
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        preexec_fn=die_with_parent,
        env={**os.environ},
    )


async def pump(process: asyncio.subprocess.Process, on_cut: Callable[[], None]) -> None:
    """Read the child's output until EOF, calling `on_cut` for each line cut. Nothing here may
    end the loop early: a reader that stops leaves the pipe to fill, and then llama-server blocks
    on its next log line."""
    assert process.stdout is not None
    lines = LineReader()
    while True:
        try:
            chunk = await process.stdout.read(READ_CHUNK)
        except (OSError, ValueError) as exc:
            log.warning("llama-server output unreadable", extra={"error": str(exc)})
            chunk = b""
        if not chunk:
            for line, cut in lines.flush():
                _emit(line, cut, process.pid, on_cut)
            return
        for line, cut in lines.feed(chunk):
            _emit(line, cut, process.pid, on_cut)


def _emit(raw: bytes, cut: bool, pid: int, on_cut: Callable[[], None]) -> None:
    try:
        text = raw.decode("utf-8", "replace").rstrip()
        if not text:
            return
        extra: dict[str, object] = {"source": "llama-server", "pid": pid}
        if cut:
            on_cut()
            extra["line_cut"] = True  # the rest of this line was read and dropped
        child_log.info(text, extra=extra)
    except Exception:  # a log handler failing must not stop the pump
        log.exception("could not log a llama-server output line")


async def terminate(process: asyncio.subprocess.Process, timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
    if process.returncode is None:
        process.terminate()
        # A stopped child acts on SIGTERM only once it runs again.
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
