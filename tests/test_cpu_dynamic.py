"""A dynamic split of the CPU (SEMIF_CPU_SHARING=dynamic): the engine's thread count changed
between ubatches, the routing of chat between two llama-servers, and both through the real
proxy."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from semif_proxy import native
from semif_proxy.cpu import plan_threads
from semif_proxy.cpu_dynamic import CpuDynamicSplit
from semif_proxy.errors import Timeout
from semif_proxy.settings import SettingsError, load_settings
from semif_proxy.testing.server import ProxyProcess, wait_for
from tests.test_cpu_slicer import LONG_STATE, long_decision

# -- the engine's thread count -------------------------------------------------------------------


def test_the_thread_count_changes_between_ubatches_and_no_bit_moves(
    engine: native.Engine,
) -> None:
    prompt = engine.tokenize(LONG_STATE, add_special=True)
    assert len(prompt) > 512
    ids = [engine.tokenize(c, parse_special=False)[0] for c in "ABCD"]

    def fresh(threads: int) -> tuple:
        engine.set_threads(threads)
        engine.reset()
        try:
            return engine.score(prompt, [[]], ids)
        finally:
            engine.reset()

    try:
        two = fresh(0)  # the fixture's 2
        one = fresh(1)
        np.testing.assert_array_equal(one[0], two[0])
        np.testing.assert_array_equal(one[1], two[1])

        # Changed while the prefix is evaluated: seen in threads_now, same bits.
        seen: set[int] = set()
        engine.set_threads(2)
        engine.reset()
        out: dict = {}
        job = threading.Thread(target=lambda: out.update(r=engine.score(prompt, [[]], ids)))
        job.start()
        wait_for(lambda: engine.threads_now == 2, 60, "the first ubatch runs on 2 threads")
        engine.set_threads(1)
        while job.is_alive():
            seen.add(engine.threads_now)
        job.join()
        assert 1 in seen, "no ubatch ran on 1 thread after the change"
        np.testing.assert_array_equal(out["r"][0], two[0])
        assert engine.threads_now == 0
    finally:
        engine.set_threads(0)
        engine.reset()


# -- the plan and the settings -----------------------------------------------------------------


def test_the_plan_divides_the_cores_only_where_it_can() -> None:
    plan = plan_threads("dynamic", 0, 0, True, True, (), cores=8)
    assert (plan.sharing, plan.engine, plan.llama_server) == ("dynamic", 8, 8)
    assert (plan.engine_split, plan.llama_server_split) == (4, 4)
    odd = plan_threads("dynamic", 0, 0, True, True, (), cores=3)
    assert (odd.engine_split, odd.llama_server_split) == (2, 1)
    # One core, one path, or llama-server's threads set by the operator: the gate.
    assert plan_threads("dynamic", 0, 0, True, True, (), cores=1).sharing == "gate"
    assert plan_threads("dynamic", 0, 0, False, True, (), cores=8).sharing == "gate"
    assert plan_threads("dynamic", 0, 0, True, True, ("-t", "3"), cores=8).sharing == "gate"
    assert plan_threads("dynamic", 0, 0, True, True, ("-tb=3",), cores=8).sharing == "gate"
    assert plan_threads("dynamic", 0, 99, True, True, (), cores=8).sharing == "gate"


def test_the_second_port_is_checked(model_path: Path) -> None:
    env = {"SEMIF_CPU_SHARING": "dynamic", "SEMIF_PORT": "9001"}
    if load_settings(env, model=str(model_path)).threads.sharing != "dynamic":
        pytest.skip("one core here: dynamic plans the gate")
    with pytest.raises(SettingsError, match=r"LLAMA_CPP_UPSTREAM_PORT: .*9001.*proxy's own"):
        load_settings({**env, "LLAMA_CPP_UPSTREAM_PORT": "9000"}, model=str(model_path))
    with pytest.raises(SettingsError, match=r"LLAMA_CPP_UPSTREAM_PORT: .*no port"):
        load_settings({**env, "LLAMA_CPP_UPSTREAM_PORT": "65535"}, model=str(model_path))
    # SageMaker's safe range: a port with its next one free too.
    ranged = load_settings(
        {**env, "SEMIF_PORT": "10001", "SAGEMAKER_SAFE_PORT_RANGE": "10000-10003"},
        model=str(model_path),
    )
    assert (ranged.upstream_port, ranged.split_upstream_port) == (10002, 10003)


# -- the routing, with stand-ins ---------------------------------------------------------------


class Engine:
    def __init__(self) -> None:
        self.wanted = 0
        self.threads_now = 0

    def set_threads(self, n: int) -> None:
        self.wanted = n


class Server:
    def __init__(self, name: str) -> None:
        self.name = name
        self.healthy = True


def dynamic() -> tuple[CpuDynamicSplit, Engine, Server, Server]:
    split = CpuDynamicSplit(engine_split=1, poll_s=0.001)
    engine, main, half = Engine(), Server("main"), Server("split")
    split.attach(engine=engine, server=main, split=half)
    return split, engine, main, half


async def settle(check: Callable[[], bool], what: str) -> None:
    for _ in range(10_000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never: {what}")


def test_alone_each_path_gets_every_core() -> None:
    async def scenario() -> None:
        gate, engine, main, _ = dynamic()
        async with gate.shared() as server:
            assert server is main
        assert engine.wanted == 0
        async with gate.exclusive():
            assert engine.wanted == 0
        assert gate.split_calls == 0

    asyncio.run(scenario())


def test_a_chat_during_a_decision_goes_to_the_split_server_once_the_engine_steps_back() -> None:
    async def scenario() -> None:
        gate, engine, _, half = dynamic()
        got: list[object] = []
        async with gate.exclusive():
            engine.threads_now = 2  # the decision's ubatch in progress, on every core

            async def chat() -> None:
                async with gate.shared(5) as server:
                    got.append(server)
                    await asyncio.sleep(0.01)

            task = asyncio.create_task(chat())
            await settle(lambda: engine.wanted == 1, "the engine told to step back")
            await asyncio.sleep(0.02)
            assert not got and gate.waiting == 1  # not beside a 2-thread ubatch
            engine.threads_now = 1  # its next ubatch
            await settle(lambda: bool(got), "the chat goes")
            assert got == [half]
            await task
        assert engine.wanted == 0 and gate.split_calls == 1 and gate.split_waits == 1

    asyncio.run(scenario())


def test_a_decision_waits_for_the_main_servers_chats_and_so_do_chats_behind_it() -> None:
    async def scenario() -> None:
        gate, engine, main, half = dynamic()
        order: list[str] = []
        end_first = asyncio.Event()

        async def first_chat() -> None:
            async with gate.shared() as server:
                assert server is main
                order.append("chat-main")
                await end_first.wait()
            order.append("chat-main-done")

        async def decision() -> None:
            async with gate.exclusive(5):
                order.append("decision")

        async def later_chat() -> None:
            async with gate.shared(5) as server:
                assert server is half
                order.append("chat-split")

        t1 = asyncio.create_task(first_chat())
        await settle(lambda: order == ["chat-main"], "the first chat runs")
        t2 = asyncio.create_task(decision())
        await settle(lambda: gate.decisions == 1, "the decision waits")
        t3 = asyncio.create_task(later_chat())
        await settle(lambda: gate.split_chats == 1, "the later chat waits")
        await asyncio.sleep(0.02)
        assert order == ["chat-main"]  # nothing beside the main server's 2 threads
        end_first.set()
        await asyncio.gather(t1, t2, t3)
        assert order[:2] == ["chat-main", "chat-main-done"]
        assert set(order[2:]) == {"decision", "chat-split"}
        assert engine.wanted == 0

    asyncio.run(scenario())


def test_without_a_split_server_answering_chat_takes_the_gate() -> None:
    async def scenario() -> None:
        gate, _, main, half = dynamic()
        half.healthy = False
        got: list[object] = []
        async with gate.exclusive():

            async def chat() -> None:
                async with gate.shared(5) as server:
                    got.append(server)

            task = asyncio.create_task(chat())
            await asyncio.sleep(0.02)
            assert not got  # behind the decision, as at the gate
        await task
        assert got == [main]

    asyncio.run(scenario())


def test_no_chat_goes_to_the_main_server_beside_one_on_the_split_server() -> None:
    async def scenario() -> None:
        gate, _, _, half = dynamic()
        async with gate.exclusive(), gate.shared(5) as first:
            assert first is half
            half.healthy = False  # two probes missed while it generates
            async with gate.shared(5) as second:
                assert second is half  # not the main one's every core beside it

    asyncio.run(scenario())


def test_a_chat_that_cannot_get_cores_in_time_gets_a_timeout() -> None:
    async def scenario() -> None:
        gate, engine, _, _ = dynamic()
        async with gate.exclusive():
            engine.threads_now = 2  # never steps back
            with pytest.raises(Timeout):
                async with gate.shared(0.05):
                    pass
        assert gate.split_chats == 0 and gate.waiting == 0 and engine.wanted == 0

    asyncio.run(scenario())


# -- through the real proxy ----------------------------------------------------------------------


def threads_arg(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return argv[argv.index(b"--threads") + 1].decode()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="dynamic plans the gate on 1 core")
def test_a_decision_and_chats_at_once_divide_the_cores_and_agree_with_quiet_runs(
    model_path: Path, tmp_path: Path
) -> None:
    import aiohttp

    env = {"SEMIF_THREADS": None, "SEMIF_CPU_SHARING": "dynamic", "SEMIF_PREFIX_CACHE_MB": "0"}
    server = ProxyProcess(model_path, env, log_path=tmp_path / "dynamic.log")
    server.start()
    try:
        wait_for(
            lambda: server.call("GET", "/health").json()["llama_server_split"]["healthy"],
            120,
            "the split llama-server is healthy",
        )
        health = server.call("GET", "/health").json()
        cpu = health["cpu"]
        assert cpu["sharing"] == "dynamic"
        assert threads_arg(health["llama_server"]["pid"]) == str(cpu["llama_server_threads"])
        split_pid = health["llama_server_split"]["pid"]
        assert threads_arg(split_pid) == str(cpu["llama_server_split_threads"])
        decision = long_decision("dynamic")
        chat = {
            "messages": [{"role": "user", "content": "Tell a long story about a lighthouse."}],
            "max_tokens": 48,
            "temperature": 0,
            "stream": True,
        }
        quiet_decision = server.call("POST", "/v1/decisions", decision).json()

        async def stream(session: aiohttp.ClientSession) -> str:
            text = []
            async with session.post(server.url + "/v1/chat/completions", json=chat) as r:
                assert r.status == 200
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        delta = json.loads(line[6:])["choices"][0].get("delta", {})
                        text.append(delta.get("content") or "")
            return "".join(text)

        async def quiet_chat() -> str:
            async with aiohttp.ClientSession() as session:
                return await stream(session)

        async def together() -> tuple[list[dict], list[str]]:
            async with aiohttp.ClientSession() as session:

                async def decide() -> dict:
                    async with session.post(server.url + "/v1/decisions", json=decision) as r:
                        assert r.status == 200
                        return await r.json()

                async def chats() -> list[str]:
                    # Sent once the decision is in the engine: they go to the split server.
                    await asyncio.to_thread(
                        wait_for,
                        lambda: server.metric("semif_engine_job_running") == 1,
                        60,
                        "the decision runs",
                    )
                    return list(await asyncio.gather(stream(session), stream(session)))

                answers = await asyncio.gather(decide(), decide(), chats())
                return [answers[0], answers[1]], answers[2]

        quiet_text = asyncio.run(quiet_chat())
        answers, texts = asyncio.run(together())
        after = server.call("GET", "/health").json()["cpu"]
        assert after["split_calls"] >= 2, "the chats did not go to the split llama-server"
        for answer in answers:
            # Fewer threads for some of its ubatches: the very same numbers.
            assert answer["result"]["probabilities"] == quiet_decision["result"]["probabilities"]
        # Both answered in full. (Not compared whole with quiet_text: two streams batched
        # together, or one after the other, may break a greedy tie differently.)
        assert all(t.startswith(quiet_text[:20]) and len(t) > 40 for t in texts), texts

        # The split server killed: chat goes on through the main one, and it comes back.
        os.kill(split_pid, signal.SIGKILL)
        assert server.call("GET", "/ping").status == 200
        # (Not compared with quiet_text: the main server now meets its cached prompt, which
        # shifts a greedy tie some tokens in.)
        assert asyncio.run(quiet_chat()).startswith(quiet_text[:20])
        wait_for(
            lambda: (
                (s := server.call("GET", "/health").json()["llama_server_split"])["healthy"]
                and s["restarts"] == 1
            ),
            120,
            "the split llama-server restarted",
        )
    finally:
        assert server.stop() == 0
