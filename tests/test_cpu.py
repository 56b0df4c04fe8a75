"""CPU sharing between the engine and llama-server: the cores a container may use, the thread
plan per design, and the gate's order of turns (pure, no model)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from semif_proxy.cpu.gate import CpuGate
from semif_proxy.cpu.plan import available_cores, plan_threads, quota_cores
from semif_proxy.errors import Timeout


def cgroup(tmp_path: Path, v2: str | None = None, v1: tuple[str, str] | None = None) -> Path:
    if v2 is not None:
        (tmp_path / "cpu.max").write_text(v2 + "\n")
    if v1 is not None:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(v1[0] + "\n")
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(v1[1] + "\n")
    return tmp_path


@pytest.mark.parametrize(
    ("v2", "v1", "quota"),
    [
        ("max 100000", None, None),
        ("200000 100000", None, 2.0),
        ("150000 100000", None, 1.5),
        (None, ("-1", "100000"), None),
        (None, ("50000", "100000"), 0.5),
        (None, None, None),
    ],
)
def test_cgroup_quota_v1_and_v2(tmp_path: Path, v2, v1, quota) -> None:
    assert quota_cores(cgroup(tmp_path, v2, v1)) == quota


def test_a_quota_caps_the_cores(tmp_path: Path) -> None:
    assert available_cores(cgroup(tmp_path, "50000 100000")) == 1  # half a core: one thread
    assert available_cores(cgroup(tmp_path / "x" if False else tmp_path, None)) >= 1
    many = cgroup(tmp_path / "many" if (tmp_path / "many").mkdir() is None else tmp_path)
    (many / "cpu.max").write_text("6400000 100000\n")  # 64 cores' worth: affinity still caps
    assert available_cores(many) <= len(__import__("os").sched_getaffinity(0))


@pytest.mark.parametrize(
    ("sharing", "chat", "gpu", "args", "expected"),
    [
        ("auto", True, 0, (), ("dynamic", 8, 8)),
        ("auto", True, 0, ("-t", "3"), ("gate", 8, None)),
        ("auto", True, 99, (), ("none", 8, 8)),
        ("auto", False, 0, (), ("none", 8, 8)),
        ("split", True, 0, (), ("split", 4, 4)),
        ("gate", True, 0, ("--threads", "3"), ("gate", 8, None)),
        ("split", False, 0, (), ("split", 8, 0)),
    ],
)
def test_thread_plan(sharing, chat, gpu, args, expected) -> None:
    plan = plan_threads(sharing, 0, gpu, chat, True, args, cores=8)
    want = expected if expected[2] != 0 else (expected[0], expected[1], None)
    if not chat:
        assert (plan.sharing, plan.engine) == want[:2]
    else:
        assert (plan.sharing, plan.engine, plan.llama_server) == want


def test_explicit_engine_threads_win() -> None:
    assert plan_threads("split", 3, 0, True, True, (), cores=8).engine == 3
    assert plan_threads("split", 3, 0, True, True, (), cores=8).llama_server == 5


async def settle(condition: Callable[[], bool], what: str) -> None:
    """Yield to the event loop until condition() holds: no wall-clock sleeps, so the order of
    events is the gate's doing, not the scheduler's. Fails after 10,000 turns."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


async def _order(gate: CpuGate, script: list[tuple[str, str]]) -> list[str]:
    """The first (name, kind) takes the gate and holds it; each next one starts only once the
    one before it waits in the queue. Then the first leaves; every later one leaves as soon as
    it is in. Returns the order they got in."""
    got: list[str] = []
    release_first = asyncio.Event()

    async def job(name: str, kind: str, first: bool) -> None:
        ctx = gate.engine_turn() if kind == "x" else gate.chat_turn()
        async with ctx:
            got.append(name)
            if first:
                await release_first.wait()

    tasks = []
    for i, (name, kind) in enumerate(script):
        tasks.append(asyncio.create_task(job(name, kind, first=i == 0)))
        if i == 0:
            await settle(lambda: got == [script[0][0]], f"{name} holds the gate")
        else:
            await settle(lambda i=i: gate.waiting == i, f"{name} waits")
    release_first.set()
    await asyncio.gather(*tasks)
    return got


def test_gate_alternates_and_nobody_starves() -> None:
    gate = CpuGate()
    order = asyncio.run(
        _order(
            gate,
            [
                ("d1", "x"),  # running
                ("d2", "x"),  # waits
                ("d3", "x"),  # waits
                ("c1", "s"),  # arrives behind two decisions: goes right after d1
                ("c2", "s"),
            ],
        )
    )
    assert order == ["d1", "c1", "c2", "d2", "d3"]


def test_chats_share_and_a_waiting_decision_holds_new_chats_back() -> None:
    gate = CpuGate()

    async def scenario() -> list[str]:
        got: list[str] = []
        chats_done = asyncio.Event()

        async def chat(name: str, hold: bool) -> None:
            async with gate.chat_turn():
                got.append(name)
                if hold:
                    await chats_done.wait()

        async def decision(name: str) -> None:
            async with gate.engine_turn():
                assert gate.shared_holders == 0
                got.append(name)

        a = asyncio.create_task(chat("c1", True))
        b = asyncio.create_task(chat("c2", True))  # shares with c1
        await settle(lambda: gate.shared_holders == 2, "c1 and c2 share the gate")
        d = asyncio.create_task(decision("d1"))
        await settle(lambda: gate.waiting == 1, "d1 waits for the chats")
        c = asyncio.create_task(chat("c3", False))  # must not overtake the waiting decision
        await settle(lambda: gate.waiting == 2, "c3 waits behind d1")
        chats_done.set()
        await asyncio.gather(a, b, c, d)
        return got

    assert asyncio.run(scenario()) == ["c1", "c2", "d1", "c3"]


def test_a_waiter_that_gives_up_frees_its_place() -> None:
    gate = CpuGate()

    async def scenario() -> None:
        async with gate.engine_turn():
            with pytest.raises(Timeout):
                async with gate.engine_turn(timeout=0.05):
                    raise AssertionError("must not get in")
            waiter = asyncio.create_task(gate.engine_turn().__aenter__())
            await settle(lambda: gate.waiting == 1, "the waiter queues")
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert gate.waiting == 0
        # Both gave up: the gate is free again, for either kind.
        async with gate.chat_turn():
            assert gate.shared_holders == 1
        async with gate.engine_turn():
            assert gate.exclusive_held

    asyncio.run(scenario())


def test_a_disabled_gate_lets_everything_through_at_once() -> None:
    gate = CpuGate(enabled=False)

    async def scenario() -> None:
        async with gate.engine_turn(), gate.engine_turn(), gate.chat_turn():
            assert not gate.exclusive_held and gate.shared_holders == 0

    asyncio.run(scenario())


class Upstream:
    def __init__(self) -> None:
        self.healthy = True


def test_a_stalled_llama_servers_chats_hold_no_decision_back() -> None:
    """Chats hold their turn until their last chunk; once their llama-server is counted
    unhealthy (missed probes: stopped, wedged) the first waiting decision goes beside them,
    one decision at a time, and the turns the chats hold stay counted."""
    gate, server = CpuGate(), Upstream()
    gate.attach(server=server)

    async def scenario() -> None:
        chat = gate.chat_turn()
        await chat.__aenter__()
        got: list[str] = []
        first_done = asyncio.Event()

        async def decision(name: str, hold: bool) -> None:
            async with gate.engine_turn(timeout=30):
                got.append(name)
                if hold:
                    await first_done.wait()

        d1 = asyncio.create_task(decision("d1", True))
        await settle(lambda: gate.waiting == 1, "d1 waits for the chat")
        d2 = asyncio.create_task(decision("d2", False))
        await settle(lambda: gate.waiting == 2, "d2 waits behind d1")
        await asyncio.sleep(0.6)  # a few polls while the server answers: nobody passes
        assert got == [] and gate.stalled_passes == 0
        server.healthy = False  # probes failed in a row
        await asyncio.wait_for(_until(lambda: got == ["d1"]), 5)
        await asyncio.sleep(0.6)
        assert got == ["d1"] and gate.exclusive_held and gate.shared_holders == 1  # one at a time
        first_done.set()
        await asyncio.wait_for(asyncio.gather(d1, d2), 5)
        assert got == ["d1", "d2"] and gate.stalled_passes == 2
        assert gate.stats() == {"stalled_chat_passes": 2}
        await chat.__aexit__(None, None, None)  # the chat ends at last (its server was killed)
        assert gate.shared_holders == 0 and not gate.exclusive_held and gate.waiting == 0
        async with gate.engine_turn(timeout=1):  # and the gate works as before
            assert gate.exclusive_held

    asyncio.run(scenario())


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)
