"""Every forward pass of the engine on one thread (engine_thread.py): a second OpenMP pool in the
process makes libgomp sleep at every graph node's barrier, and every decision slower."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from semif_proxy.engine_thread import EngineThread
from semif_proxy.testing.server import ProxyProcess
from tests.test_cpu_slicer import long_decision


def test_calls_run_on_the_engine_thread_from_outside_and_inline_from_inside() -> None:
    thread = EngineThread()
    try:
        outside = threading.get_ident()
        inner = thread.call(threading.get_ident)
        assert inner != outside
        # A job that calls into the engine again runs inline instead of waiting for itself.
        nested = thread.submit(lambda: (threading.get_ident(), thread.call(threading.get_ident)))
        assert nested.result(timeout=10) == (inner, inner)
        assert not thread.current
    finally:
        thread.shutdown()


def voluntary_switches(pid: int) -> int:
    """Sleeps in the kernel, summed over the process's threads (ggml's threads sleep at a
    barrier only when libgomp stops spinning there)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{task}/status").read_text()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one engine thread: no OpenMP pool")
def test_a_served_decision_does_not_sleep_at_ggml_barriers(model_path: Path) -> None:
    # The default settings: the engine on every core (an OpenMP team), loaded, self-checked and
    # deciding in the served process. Measured before the engine thread: about 800 sleeps a
    # decision of this size (the load's pool beside the decisions' one); after: under 5.
    server = ProxyProcess(model_path, {"SEMIF_THREADS": None, "SEMIF_PREFIX_CACHE_MB": "0"})
    server.start()
    try:
        assert server.proc is not None
        decisions = 4
        first = server.call("POST", "/v1/decisions", long_decision("warm"))
        assert first.status == 200, first.body
        assert first.json()["result"]["model"]["threads"] >= 2
        before = voluntary_switches(server.proc.pid)
        for n in range(decisions):
            reply = server.call("POST", "/v1/decisions", long_decision(f"d{n}"))
            assert reply.status == 200, reply.body
        slept = voluntary_switches(server.proc.pid) - before
        # The HTTP side sleeps a few times per request too (its event loop waits on sockets).
        assert slept < 60 * decisions, f"{slept} sleeps in {decisions} decisions"
    finally:
        server.stop()
