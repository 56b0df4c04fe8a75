"""Every forward pass of the engine on one thread (engine_thread.py): a second OpenMP pool in the
process makes libgomp sleep at every graph node's barrier, and every decision slower."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from semif_proxy.engine.thread import EngineThread
from semif_proxy.settings import UBATCH_CPU, UBATCH_GPU
from semif_proxy.testing.server import ProxyProcess, wait_for
from tests.conftest import GPU_LAYERS
from tests.helpers.long_decision import long_decision

# Counts OpenMP sleeps at ggml barriers: another test's load would add some (the serial part).
pytestmark = pytest.mark.serial


def test_calls_run_on_the_engine_thread_from_outside_and_inline_from_inside() -> None:
    thread = EngineThread()
    try:
        outside = threading.get_ident()
        inner = thread.call(threading.get_ident)
        assert inner != outside
        # A job that calls into the engine again runs inline instead of waiting for itself.
        nested = thread.executor.submit(
            lambda: (threading.get_ident(), thread.call(threading.get_ident))
        )
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


def settled(server: ProxyProcess) -> bool:
    """The second llama-server (CPU sharing dynamic) done loading, or not started: its load
    beside the decisions would preempt their threads and make them sleep for other reasons."""
    split = server.call("GET", "/health").json().get("llama_server_split")
    return split is None or split["healthy"] or split["state"] == "not started"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one engine thread: no OpenMP pool")
def test_a_served_decision_does_not_sleep_at_ggml_barriers(model_path: Path) -> None:
    # The default settings: the engine on every core (an OpenMP team), loaded, self-checked and
    # deciding in the served process. Measured on 2 cores before the engine thread: 3,637
    # sleeps in these 4 decisions (the load's pool beside the decisions' one); after: a few.
    server = ProxyProcess(model_path, {"SEMIF_THREADS": None, "SEMIF_PREFIX_CACHE_MB": "0"})
    server.start()
    try:
        assert server.proc is not None
        wait_for(lambda: settled(server), 120, "the start has settled")
        decisions = 4
        first = server.call("POST", "/v1/decisions", long_decision("warm"))
        assert first.status == 200, first.body
        model = first.json()["result"]["model"]
        threads = model["threads"]
        assert threads >= 2
        # The default ubatch reached the served engine.
        assert model["ubatch"] == (UBATCH_GPU if GPU_LAYERS else UBATCH_CPU)
        before = voluntary_switches(server.proc.pid)
        for n in range(decisions):
            reply = server.call("POST", "/v1/decisions", long_decision(f"d{n}"))
            assert reply.status == 200, reply.body
        slept = voluntary_switches(server.proc.pid) - before
        # Each idle OpenMP worker sleeps once in a while between graphs, and the HTTP side a
        # few times per request (its event loop waits on sockets): a bound per engine thread.
        assert slept < 30 * threads * decisions, f"{slept} sleeps in {decisions} decisions"
    finally:
        server.stop()
