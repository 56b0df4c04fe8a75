"""Time-slicing the CPU (SEMIF_CPU_SHARING=slice): the engine's pause at a graph node, the
slicer's turns against a real process, and both through the real proxy."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from semif_proxy import native
from semif_proxy.cpu_slicer import CpuSlicer, process_state, process_stopped
from semif_proxy.engine import DecisionEngine
from semif_proxy.settings import SettingsError, load_settings
from semif_proxy.testing.server import ProxyProcess, wait_for

LONG_STATE = "The parcel was marked delivered but never reached the customer's door. " * 60


def long_decision(name: str) -> dict:
    """A decision on LONG_STATE (two ubatches), for runs beside a chat."""
    return {
        "decision": {
            "id": name,
            "state": LONG_STATE,
            "question": "Which team handles it?",
            "options": [
                {"id": "shipping", "description": "Delivery and lost parcels"},
                {"id": "billing", "description": "Payments and refunds"},
            ],
        }
    }


def letter_ids(engine: native.Engine) -> list[int]:
    return [engine.tokenize(c, parse_special=False)[0] for c in "ABCD"]


def quiet_run(engine: native.Engine) -> tuple[list[int], list[int], tuple]:
    """The long prompt, the letter ids, and its scores from a fresh prefill, undisturbed; the
    engine is left holding no prefix, so the next score prefills anew."""
    prompt = engine.tokenize(LONG_STATE, add_special=True)
    ids = letter_ids(engine)
    engine.reset()
    quiet = engine.score(prompt, [[]], ids)
    engine.reset()
    return prompt, ids, quiet


def score_in_thread(engine: native.Engine, prompt: list[int], ids: list[int]) -> tuple:
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = engine.score(prompt, [[]], ids)
        except native.LlamaError as exc:
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


# -- the engine's pause ------------------------------------------------------------------------


def test_a_paused_job_parks_and_resumes_to_the_same_numbers(engine: native.Engine) -> None:
    prompt, ids, (quiet, quiet_lse, _) = quiet_run(engine)
    parks = engine.parks
    engine.pause()
    try:
        thread, out = score_in_thread(engine, prompt, ids)
        wait_for(lambda: engine.parked, 60, "the job parks at a graph node")
        assert thread.is_alive() and engine.parks == parks + 1
    finally:
        engine.resume()
    thread.join(120)
    assert not thread.is_alive() and "error" not in out
    logits, lse, _ = out["result"]
    # Parked mid-graph and resumed: nothing recomputed, so the very same bits.
    np.testing.assert_array_equal(logits, quiet)
    np.testing.assert_array_equal(lse, quiet_lse)
    assert not engine.parked


def test_an_abort_ends_a_parked_job(engine: native.Engine) -> None:
    prompt = engine.tokenize(LONG_STATE, add_special=True)
    ids = letter_ids(engine)
    engine.reset()
    engine.pause()
    try:
        thread, out = score_in_thread(engine, prompt, ids)
        wait_for(lambda: engine.parked, 60, "the job parks")
        engine.abort()
        thread.join(30)
        assert not thread.is_alive(), "a parked job did not end on abort"
        assert out["error"].code == native.ERR_ABORTED
    finally:
        engine.resume()
        engine.clear_abort()
    logits, _, _ = engine.score(prompt[:20], [[]], ids)  # usable afterwards
    assert logits.shape == (1, 4)


def test_this_build_sleeps_at_barriers(decision_engine) -> None:
    # The slicer relies on ggml's CPU backend using OpenMP (a parked engine's other threads
    # then sleep); without it the proxy falls back to the gate. This build must have it.
    assert decision_engine.parks_quietly is True


# -- the slicer against a real process -----------------------------------------------------------


class Child:
    """A real process in llama-server's place: the slicer stops and continues it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["sleep", "300"])
        self.answering = True

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def close(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def child() -> Iterator[Child]:
    c = Child()
    yield c
    c.close()


async def settle(check: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.002)


def test_turns_stop_and_continue_the_server_and_end_with_it_running(
    decision_engine, child: Child
) -> None:
    core = decision_engine.core
    prompt, ids, (quiet, _, _) = quiet_run(core)
    parks = core.parks

    async def scenario() -> CpuSlicer:
        slicer = CpuSlicer(round_s=0.04, chat_share=0.5)
        slicer.attach(engine=decision_engine, server=child)
        seen_stopped = seen_running = 0
        async with slicer.shared():
            async with slicer.exclusive():  # the newcomer (the engine) goes first
                job = asyncio.create_task(asyncio.to_thread(core.score, prompt, [[]], ids))
                await settle(lambda: slicer.turns >= 1, "the first turn")
                deadline = time.monotonic() + 60
                while not job.done() or slicer.turns < 8:
                    assert time.monotonic() < deadline, "the job or the turns stalled"
                    if process_stopped(child.pid):
                        seen_stopped += 1
                    else:
                        seen_running += 1
                    await asyncio.sleep(0.002)
                logits, _, _ = await job
            # The decision ended: the server runs again at once, not a turn later.
            assert not process_stopped(child.pid)
        assert seen_stopped and seen_running, (seen_stopped, seen_running)
        np.testing.assert_array_equal(logits, quiet)  # parked and resumed: the same bits
        return slicer

    slicer = asyncio.run(scenario())
    assert not process_stopped(child.pid) and slicer.turns >= 8
    assert core.parks > parks, "the job never parked on llama-server's turns"


def test_never_stops_an_unhealthy_server_nor_continues_one_it_did_not_stop(
    decision_engine, child: Child
) -> None:
    async def turns(n: int, check: Callable[[], None]) -> None:
        slicer = CpuSlicer(round_s=0.02)  # one per event loop, as in the server
        slicer.attach(engine=decision_engine, server=child)
        async with slicer.shared(), slicer.exclusive():
            start = slicer.turns
            deadline = time.monotonic() + 30
            while slicer.turns < start + n:
                assert time.monotonic() < deadline, "no turns taken"
                check()
                await asyncio.sleep(0.002)

    def never_stopped() -> None:
        assert not process_stopped(child.pid), "stopped a server the supervisor counts unhealthy"

    child.answering = False  # starting, restarting or failing its probes
    asyncio.run(turns(6, never_stopped))

    child.answering = True
    os.kill(child.pid, signal.SIGSTOP)  # a stall from outside (the chaos tests make these)
    wait_for(lambda: process_stopped(child.pid), 10, "the child stops")
    asyncio.run(turns(6, lambda: None))
    assert process_stopped(child.pid), "continued a process someone else stopped"


def test_close_releases_both(decision_engine, child: Child) -> None:
    async def scenario() -> None:
        slicer = CpuSlicer(round_s=2.0, chat_share=0.5)  # the engine's turn lasts 1 s
        slicer.attach(engine=decision_engine, server=child)
        async with slicer.shared(), slicer.exclusive():
            await settle(lambda: process_stopped(child.pid), "the engine's turn")
            await slicer.close()
            assert not process_stopped(child.pid)

    asyncio.run(scenario())


def test_without_openmp_the_gate_takes_over(
    decision_engine, child: Child, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A ggml whose threads only spin (GGML_OPENMP=OFF) is not built here; what it reports is
    # stood in for.
    monkeypatch.setattr(DecisionEngine, "parks_quietly", property(lambda self: False))

    async def scenario() -> None:
        slicer = CpuSlicer()
        slicer.attach(engine=decision_engine, server=child)
        assert slicer.fallback is not None
        async with slicer.exclusive():
            waiter = asyncio.create_task(slicer.shared().__aenter__())
            await settle(lambda: slicer.waiting == 1, "a chat waits for the decision")
            assert not process_stopped(child.pid)
        await waiter
        assert slicer.fallback.shared_holders == 1

    asyncio.run(scenario())


def test_a_health_probe_outlasts_an_engine_turn(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    env = {"SEMIF_CPU_SHARING": "slice", "SEMIF_HEALTH_TIMEOUT": "0.15"}
    with pytest.raises(SettingsError, match="SEMIF_HEALTH_TIMEOUT"):
        load_settings(env, model=str(model))  # llama-server is stopped for 0.2 s at a time
    load_settings({**env, "SEMIF_CPU_SLICE_MS": "200"}, model=str(model))  # 0.1 s turns
    load_settings({**env, "SEMIF_CPU_SHARING": "gate"}, model=str(model))


# -- through the real proxy -----------------------------------------------------------------


def llama_pid(server: ProxyProcess) -> int:
    return server.call("GET", "/health").json()["llama_server"]["pid"]


def test_a_decision_and_a_chat_at_once_take_turns_and_agree_with_quiet_runs(
    model_path: Path, tmp_path: Path
) -> None:
    # Every core for both, as `make run` starts them, sliced.
    # No prefix cache, and another state asked in between: the sliced decision prefills anew.
    env = {"SEMIF_THREADS": None, "SEMIF_CPU_SHARING": "slice", "SEMIF_PREFIX_CACHE_MB": "0"}
    server = ProxyProcess(model_path, env, log_path=tmp_path / "slice.log")
    server.start()
    try:
        health = server.call("GET", "/health").json()
        assert health["cpu"]["sharing"] == "slice"
        pid = llama_pid(server)
        decision = long_decision("slice")
        chat = {
            "messages": [{"role": "user", "content": "Tell a long story about a lighthouse."}],
            "max_tokens": 160,
            "temperature": 0,
            "ignore_eos": True,
        }
        quiet_decision = server.call("POST", "/v1/decisions", decision).json()
        other = {"decision": {**decision["decision"], "state": "Another ticket. " * 30}}
        assert server.call("POST", "/v1/decisions", other).status == 200
        turns_before = health["cpu"]["slice_turns"]

        async def both(with_decision: bool) -> tuple[dict | None, str]:
            import aiohttp

            # One probe of llama-server that times out on a busy machine makes chat a 503
            # until the next one passes (the supervisor's rule, not the slicer's): each run
            # starts once /ping says both paths are ready.
            await asyncio.to_thread(
                wait_for, lambda: server.call("GET", "/ping").status == 200, 30, "/ping 200"
            )

            async with aiohttp.ClientSession() as session:
                started = asyncio.Event()

                async def stream() -> str:
                    text = []
                    body = {**chat, "stream": True}
                    async with session.post(server.url + "/v1/chat/completions", json=body) as r:
                        assert r.status == 200
                        async for line in r.content:
                            if line.startswith(b"data: {"):
                                delta = json.loads(line[6:])["choices"][0].get("delta", {})
                                if delta.get("content"):
                                    started.set()
                                    text.append(delta["content"])
                    return "".join(text)

                async def decide() -> dict:
                    await started.wait()  # the chat is generating: both run from here
                    async with session.post(server.url + "/v1/decisions", json=decision) as r:
                        assert r.status == 200
                        return await r.json()

                if not with_decision:
                    return None, await stream()
                text, answer = await asyncio.gather(stream(), decide())
                return answer, text

        # Twice alone first: the second run meets llama-server's prompt cache, as the run
        # beside the decision does (a cached prompt shifts a greedy tie some tokens in).
        asyncio.run(both(False))
        _, quiet_text = asyncio.run(both(False))
        parks_before = server.call("GET", "/health").json()["cpu"]["engine_parks"]
        answer, text = asyncio.run(both(True))
        assert answer is not None
        health = server.call("GET", "/health").json()
        assert health["cpu"]["slice_turns"] > turns_before + 2, "no turns were taken"
        assert health["cpu"]["engine_parks"] > parks_before, "the decision never parked"
        assert health["cpu"]["slice_fallback"] is False
        # Stopped and parked, nothing recomputed: the same numbers and the same text.
        assert answer["result"]["probabilities"] == quiet_decision["result"]["probabilities"]
        assert text == quiet_text
        assert not process_stopped(pid)
    finally:
        assert server.stop() == 0


def test_a_stopped_llama_server_dies_with_a_killed_proxy(model_path: Path, tmp_path: Path) -> None:
    server = ProxyProcess(model_path, {"SEMIF_DECISIONS": "off"}, log_path=tmp_path / "k.log")
    server.start()
    pid = llama_pid(server)
    os.kill(pid, signal.SIGSTOP)  # as the slicer leaves it during an engine turn
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait()
    try:
        wait_for(lambda: gone(pid), 30, "the stopped llama-server ends with its proxy")
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)  # never leave a stopped orphan on its port


def gone(pid: int) -> bool:
    return process_state(pid) in (None, "Z", "X")
