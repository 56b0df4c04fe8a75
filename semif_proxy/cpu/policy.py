"""The one interface of CPU sharing: how a decision's engine job and a chat call take the
cores (SEMIF_CPU_SHARING, planned in plan.py). Callers hold a `CpuPolicy` from `make_policy`
and never ask which one it is.

- `gate` (gate.py): both paths get every core, one job at a time;
- `dynamic` (dynamic.py): every core to whichever path runs alone, divided while both run (a
  second llama-server with part of the threads takes chat then, and the engine lowers its own);
- `split` and `none`: turns pass at once (the thread counts divide the cores, or nothing
  needs guarding: GPU offload).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from semif_proxy.cpu.dynamic import CpuDynamicSplit
from semif_proxy.cpu.gate import CpuGate
from semif_proxy.cpu.plan import ThreadPlan


class Threaded(Protocol):
    """The engine as a policy steers it."""

    def set_threads(self, n: int) -> None: ...
    @property
    def threads_now(self) -> int: ...


class Upstream(Protocol):
    """A llama-server as a policy routes chat to it."""

    @property
    def healthy(self) -> bool:
        """Started and not counted stalled (gate.py: a stalled one holds no decision back)."""
        ...


class CpuPolicy(Protocol):
    name: str
    # Whether it wants a second llama-server to send chat to (started by the lifecycle when a
    # port and the memory for it are left).
    second_server: bool

    @property
    def waiting(self) -> int:
        """Turns waited for now."""
        ...

    @property
    def waits(self) -> int:
        """Turns that had to wait, since the start."""
        ...

    def engine_turn(self, timeout: float | None = None) -> AbstractAsyncContextManager[None]:
        """A decision's engine job holds this while it runs."""
        ...

    def chat_turn(
        self, timeout: float | None = None
    ) -> AbstractAsyncContextManager[Upstream | None]:
        """A chat call holds this until its last chunk; it yields the llama-server to send the
        call to (None: the main one)."""
        ...

    def attach(
        self, engine: Threaded | None = None, server: Upstream | None = None, split: Any = None
    ) -> None:
        """What it steers, as each becomes ready."""
        ...

    def stats(self, engine: Any = None) -> dict[str, Any]:
        """Its own counters for /health's `cpu` block."""
        ...


def make_policy(plan: ThreadPlan) -> CpuPolicy:
    if plan.sharing == "dynamic":
        return CpuDynamicSplit(plan.engine_split)
    return CpuGate(enabled=plan.sharing == "gate", name=plan.sharing)
