"""A dynamic split of the CPU (SEMIF_CPU_SHARING=dynamic): every core to whichever path runs
alone, the cores divided while both run.

Two llama-servers serve chat, sharing the model's mmap'ed weights: the main one with every
core, and a split one with half of them. The engine changes its thread count between ubatches
(DecisionEngine.set_threads). So the machine is always in one of three states, and no core is
ever asked to run two compute threads (ggml's threads spin at every graph node; two on one
core slow each other many times over):

- decisions alone: the engine with every core;
- chat alone: the main llama-server with every core;
- both: the engine with `engine_split` threads and the split llama-server with the rest.

Why not one llama-server: its thread count is fixed when it starts. Why this beats taking
turns (gate, slice) under mixed load: on a small machine two threads do less than twice the
work of one (1.65x measured here), so two jobs side by side on half the cores each get more
done together than one job at a time on all of them.

The moves between states wait for what runs to leave the cores it needs: a decision waits for
the chats on the main llama-server to end (as at the gate); a chat sent to the split one waits
for those too, and for the engine's llama_decode call in progress if that runs on every core
(one ubatch, for a prefix). A chat goes to the split llama-server while decisions are in
flight or the split one still has chats; otherwise to the main one. While the split
llama-server is not healthy (starting, restarting, stalled: two probes missed) chat goes to
the main one through the gate, once no chat is left on the split one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Protocol

from semif_proxy.cpu_gate import CpuGate, no_turn


class Threaded(Protocol):
    def set_threads(self, n: int) -> None: ...
    @property
    def threads_now(self) -> int: ...


class Upstream(Protocol):
    @property
    def healthy(self) -> bool: ...


class CpuDynamicSplit:
    """The CPU gate's interface (exclusive: a decision; shared: a chat call, which is told the
    llama-server to use)."""

    def __init__(self, engine_split: int, poll_s: float = 0.005) -> None:
        self.enabled = True
        self.engine_split = engine_split
        self.poll_s = poll_s  # how often a chat looks whether the engine has left its cores
        self.gate = CpuGate()  # the main llama-server's chats against decisions
        self.decisions = 0  # in flight: waiting or running
        self.split_chats = 0  # in flight on the split llama-server, waiting ones included
        self.split_calls = 0  # chat calls sent to the split llama-server
        self.split_waits = 0  # of those, the ones that had to wait for cores
        self._split_waiting = 0
        self._engine: Threaded | None = None
        self._server: Upstream | None = None
        self._split: Upstream | None = None

    @property
    def waiting(self) -> int:
        return self.gate.waiting + self._split_waiting

    @property
    def waits(self) -> int:
        return self.gate.waits + self.split_waits

    def attach(
        self,
        engine: Threaded | None = None,
        server: Upstream | None = None,
        split: Upstream | None = None,
    ) -> None:
        if engine is not None:
            self._engine = engine
            self._set_engine_threads()
        if server is not None:
            self._server = server
        if split is not None:
            self._split = split

    @contextlib.asynccontextmanager
    async def exclusive(self, timeout: float | None = None) -> AsyncIterator[None]:
        """A decision's engine job."""
        self.decisions += 1
        try:
            async with self.gate.exclusive(timeout):
                yield
        finally:
            self.decisions -= 1

    @contextlib.asynccontextmanager
    async def shared(self, timeout: float | None = None) -> AsyncIterator[Upstream | None]:
        """A chat call; yields the llama-server to send it to (None: the main one)."""
        if not self._to_split():
            async with self.gate.shared(timeout):
                yield self._server
            return
        self.split_chats += 1
        self._set_engine_threads()  # from its next ubatch on
        try:
            await self._cores_free(timeout)
            self.split_calls += 1
            yield self._split
        finally:
            self.split_chats -= 1
            self._set_engine_threads()

    def _to_split(self) -> bool:
        split = self._split
        if split is None or self._engine is None:
            return False
        if self.split_chats > 0:
            # Never the main one (every core) beside chats still on the split one.
            return True
        # Healthy, not `answering`: one missed probe of a busy server is not a stall.
        return split.healthy and self.decisions > 0

    def _set_engine_threads(self) -> None:
        if self._engine is not None:
            self._engine.set_threads(self.engine_split if self.split_chats else 0)

    def _free(self) -> bool:
        """No chat on the main llama-server, and the engine not on more than its share."""
        engine = self._engine
        engine_ok = engine is None or engine.threads_now <= self.engine_split
        return self.gate.shared_holders == 0 and engine_ok

    async def _cores_free(self, timeout: float | None) -> None:
        if self._free():
            return
        # Polled: the engine's thread count changes in C++ between ubatches, with no event
        # to wait on; the wait is at most one ubatch (or the main llama-server's chats).
        self.split_waits += 1
        self._split_waiting += 1
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._free():
                if deadline is not None and time.monotonic() >= deadline:
                    raise no_turn(timeout)
                await asyncio.sleep(self.poll_s)
        finally:
            self._split_waiting -= 1
