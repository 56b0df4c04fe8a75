"""The llama-server supervisor as it meets real trouble: a stalled child (SIGSTOP/SIGCONT), one
that stays stalled, one that floods its output with a line far longer than any buffer.

Real llama-server on the tiny generated model, except for the output test, whose child is a
small script standing in for llama-server (what is tested there is the reading of its pipe).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from semif_proxy.engine import native
from semif_proxy.llama_server.output import LineReader
from semif_proxy.llama_server.supervisor import LlamaServer, Supervision
from semif_proxy.testing.server import free_port

# Probe timeouts and restart backoff in seconds (the serial part).
pytestmark = pytest.mark.serial

FAST = Supervision(start_timeout=60, probe_interval=0.2, probe_timeout=0.5, max_failed_probes=3)


async def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds it took for predicate() to hold; fails after timeout."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro_fn())


def server_for(model: Path, supervision: Supervision) -> LlamaServer:
    binary = native.llama_server_path()
    assert binary is not None
    args = ["--ctx-size", "512", "--threads", "1", "--parallel", "1"]
    return LlamaServer(binary, model, free_port(), args, supervision)


def test_a_stall_makes_it_unhealthy_and_resuming_makes_it_healthy_again(tiny_model: Path) -> None:
    supervision = dataclasses.replace(FAST, max_failed_probes=1000)  # never restart here

    async def scenario() -> None:
        server = server_for(tiny_model, supervision)
        await server.start()
        try:
            pid = server.pid
            assert pid is not None and server.healthy
            os.kill(pid, signal.SIGSTOP)
            await wait_until(lambda: not server.healthy, 10, "two failed probes")
            assert server.state == "unresponsive"
            os.kill(pid, signal.SIGCONT)
            await wait_until(lambda: server.healthy, 10, "a good probe after SIGCONT")
            # The same process, never restarted: a probe that succeeds is enough.
            assert server.pid == pid and server.restarts == 0 and server.state == "ready"
            assert server.unresponsive_kills == 0
        finally:
            await server.stop()

    run(scenario)


@pytest.mark.parametrize("misses", [1, 2])
def test_one_missed_probe_keeps_it_healthy_and_two_in_a_row_do_not(
    tiny_model: Path, misses: int
) -> None:
    """The first `misses` probes fail (injected in front of the real probe of a real child, the
    way a /health call misses its timeout on a loaded machine); the probes after them are real."""

    async def scenario() -> None:
        # A real probe with room to answer on a busy machine: only the injected ones fail.
        supervision = dataclasses.replace(FAST, probe_timeout=10, max_failed_probes=1000)
        server = server_for(tiny_model, supervision)
        await server.start()
        try:
            real_probe = server._probe
            # What each probe found before it ran: healthy, answering, state, failed probes.
            seen: list[tuple[bool, bool, str, int]] = []

            async def probe() -> bool:
                seen.append((server.healthy, server.answering, server.state, server.failed_probes))
                return len(seen) > misses and await real_probe()

            server._probe = probe  # type: ignore[method-assign]
            await wait_until(lambda: len(seen) > misses + 1, 30, "the probes after the misses")
            after_misses = seen[misses]
            if misses == 1:
                # Chat stays open; the CPU slicer gives the child no turns until a probe passes.
                assert after_misses == (True, False, "ready", 1)
            else:
                assert after_misses == (False, False, "unresponsive", 2)
            # A good probe after them: healthy again, the same process, the count reset.
            assert seen[misses + 1] == (True, True, "ready", 0)
            assert server.restarts == 0 and server.unresponsive_kills == 0
        finally:
            await server.stop()

    run(scenario)


def test_a_child_that_stays_stalled_is_killed_and_restarted(tiny_model: Path) -> None:
    async def scenario() -> None:
        server = server_for(tiny_model, FAST)
        await server.start()
        try:
            pid = server.pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            await wait_until(lambda: server.restarts == 1, 60, "a restart")
            assert server.unresponsive_kills == 1
            assert server.pid not in (None, pid) and server.healthy
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)  # the stalled one is gone, not left stopped
        finally:
            await server.stop()

    run(scenario)


def test_stop_ends_a_stopped_child(tiny_model: Path) -> None:
    async def scenario() -> None:
        server = server_for(tiny_model, dataclasses.replace(FAST, max_failed_probes=1000))
        await server.start()
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        await server.stop(timeout=60)
        # SIGTERM alone waits for a SIGCONT; stop() resumes it, so the child shuts down on the
        # SIGTERM (llama-server exits 0) instead of being killed (-9) when the timeout runs out.
        assert server.process is not None and server.process.returncode == 0
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    run(scenario)


FLOODER = textwrap.dedent(
    """
    import http.server, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    out = sys.stdout.buffer
    out.write(b"x" * (1 << 20) + b"\\n")          # one 1 MiB line
    for i in range(8):                              # then 8 MiB more: blocks if nobody reads
        out.write(b"y" * (1 << 20) + b"\\n")
    out.write(b"after the flood\\n")
    out.flush()

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
    """
)


def test_output_lines_of_a_mebibyte_never_stop_the_reader(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    child = tmp_path / "flooding-llama-server"
    child.write_text(f"#!{sys.executable}\n{FLOODER}")
    child.chmod(0o755)

    async def scenario() -> None:
        server = LlamaServer(child, tmp_path / "unused.gguf", free_port(), (), FAST)
        # The child serves /health only after writing 9 MiB: start() succeeding proves the pipe
        # was drained all along.
        await server.start()
        try:
            await wait_until(
                lambda: any(r.getMessage() == "after the flood" for r in caplog.records),
                10,
                "the line after the flood in the log",
            )
        finally:
            await server.stop()
        cut = [r for r in caplog.records if getattr(r, "line_cut", False)]
        assert cut and all(len(r.getMessage()) <= 16 * 1024 for r in cut)
        assert server.output_lines_cut == 9

    with caplog.at_level(logging.INFO, logger="semif_proxy.llama_server.output"):
        run(scenario)


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_line_reader_splits_and_cuts_whatever_the_chunking(chunk: int) -> None:
    stream = b"short\n" + b"z" * 50 + b"\n" + b"exactly twenty bytes\n" + b"tail, no newline"
    reader = LineReader(limit=20)
    lines: list[tuple[bytes, bool]] = []
    for i in range(0, len(stream), chunk):
        lines += reader.feed(stream[i : i + chunk])
    lines += reader.flush()
    assert lines == [
        (b"short", False),
        (b"z" * 20, True),  # handed on once, cut at the limit; the other 30 bytes skipped
        (b"exactly twenty bytes", False),
        (b"tail, no newline", False),
    ]
