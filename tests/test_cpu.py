"""CPU sharing between the engine and llama-server: the cores a container may use, the thread
plan per design, and the gate's order of turns (pure, no model)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from semif_proxy.cpu import available_cores, plan_threads, quota_cores
from semif_proxy.cpu_gate import CpuGate
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
        ("auto", True, 0, (), ("gate", 8, 8)),
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


async def _order(gate: CpuGate, script: list[tuple[str, str, float]]) -> list[str]:
    """Start each (name, kind, hold seconds) a moment apart; return the order they got in."""
    got: list[str] = []

    async def job(name: str, kind: str, hold: float) -> None:
        ctx = gate.exclusive() if kind == "x" else gate.shared()
        async with ctx:
            got.append(name)
            await asyncio.sleep(hold)

    tasks = []
    for name, kind, hold in script:
        tasks.append(asyncio.create_task(job(name, kind, hold)))
        await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    return got


def test_gate_alternates_and_nobody_starves() -> None:
    gate = CpuGate()
    order = asyncio.run(
        _order(
            gate,
            [
                ("d1", "x", 0.1),  # running
                ("d2", "x", 0.05),  # waits
                ("d3", "x", 0.05),  # waits
                ("c1", "s", 0.05),  # arrives behind two decisions: goes right after d1
                ("c2", "s", 0.05),
            ],
        )
    )
    assert order == ["d1", "c1", "c2", "d2", "d3"]


def test_chats_share_and_a_waiting_decision_holds_new_chats_back() -> None:
    gate = CpuGate()

    async def scenario() -> list[str]:
        got: list[str] = []

        async def chat(name: str, hold: float) -> None:
            async with gate.shared():
                got.append(name)
                await asyncio.sleep(hold)

        async def decision(name: str) -> None:
            async with gate.exclusive():
                assert gate.shared_holders == 0
                got.append(name)
                await asyncio.sleep(0.02)

        a = asyncio.create_task(chat("c1", 0.1))
        await asyncio.sleep(0.01)
        b = asyncio.create_task(chat("c2", 0.1))  # shares with c1
        await asyncio.sleep(0.01)
        assert gate.shared_holders == 2
        d = asyncio.create_task(decision("d1"))
        await asyncio.sleep(0.01)
        c = asyncio.create_task(chat("c3", 0.01))  # must not overtake the waiting decision
        await asyncio.gather(a, b, c, d)
        return got

    assert asyncio.run(scenario()) == ["c1", "c2", "d1", "c3"]


def test_a_waiter_that_gives_up_frees_its_place() -> None:
    gate = CpuGate()

    async def scenario() -> None:
        async with gate.exclusive():
            with pytest.raises(Timeout):
                async with gate.exclusive(timeout=0.05):
                    raise AssertionError("must not get in")
            waiter = asyncio.create_task(gate.exclusive().__aenter__())
            await asyncio.sleep(0.01)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert gate.waiting == 0
        # Both gave up: the gate is free again, for either kind.
        async with gate.shared():
            assert gate.shared_holders == 1
        async with gate.exclusive():
            assert gate.exclusive_held

    asyncio.run(scenario())


def test_a_disabled_gate_lets_everything_through_at_once() -> None:
    gate = CpuGate(enabled=False)

    async def scenario() -> None:
        async with gate.exclusive(), gate.exclusive(), gate.shared():
            assert not gate.exclusive_held and gate.shared_holders == 0

    asyncio.run(scenario())
