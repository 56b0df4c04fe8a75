"""A dynamic split of the CPU (SEMIF_CPU_SHARING=dynamic): every core to whichever path runs
alone, the cores divided while both run.

Two llama-servers serve chat, sharing the model's mmap'ed weights: the main one with every
core, and a split one with half of them. The engine changes its thread count between ubatches
(DecisionEngine.set_threads); a lower count preempts the ubatch in progress at its next graph
node, which is evaluated again on the lower count (same numbers, tested). So the machine is
always in one of three states, and no core is ever asked to run two compute threads (ggml's
threads spin at every graph node; two on one core slow each other many times over):

- decisions alone: the engine with every core;
- chat alone: the main llama-server with every core;
- both: the engine with `engine_split` threads and the split llama-server with the rest.

Why not one llama-server: its thread count is fixed when it starts. Why this beats taking
turns (the gate) under mixed load: on a small machine two threads do less than twice the
work of one (1.65x measured here), so two jobs side by side on half the cores each get more
done together than one job at a time on all of them.

The moves between states wait for what runs to leave the cores it needs: a decision waits for
the chats on the main llama-server to end (as at the gate); a chat sent to the split one waits
for those too, and for the engine to leave the cores of its llama_decode call in progress if
that runs on every core (milliseconds: the call is preempted and evaluated again on the
engine's share). A chat goes to the split llama-server while decisions are in flight and it is
healthy; otherwise to the main one through the gate, once no chat is left on the split one (so
chat alone gets every core back after a mixed spell, and while the split llama-server is
starting, restarting or stalled, two probes missed, chat still has the main one). Chats wait
for that drain DRAIN_GRACE_S at most, then join the split one's chats.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from semif_proxy.cpu.gate import CpuGate, no_turn
from semif_proxy.errors import Timeout
from semif_proxy.settings import CPU_DRAIN_GRACE_S

if TYPE_CHECKING:
    from semif_proxy.cpu.policy import Threaded, Upstream

# How long chats wait for the split llama-server's chats to end before they join them (a chat
# alone goes back to every core once those end; a long or slowly read stream must not hold
# every later chat back until its deadline). Its default lives with the others
# (settings/defaults.py).
DRAIN_GRACE_S = CPU_DRAIN_GRACE_S


class CpuDynamicSplit:
    """A CpuPolicy (cpu/policy.py): engine_turn for a decision, chat_turn for a chat call,
    which is told the llama-server to use."""

    name = "dynamic"
    second_server = True

    def __init__(self, engine_split: int, poll_s: float = 0.005) -> None:
        self.enabled = True
        self.engine_split = engine_split
        self.poll_s = poll_s  # how often a chat looks whether the engine has left its cores
        self.gate = CpuGate()  # the main llama-server's chats against decisions
        self.decisions = 0  # in flight: waiting or running
        self.split_chats = 0  # in flight on the split llama-server, waiting ones included
        self.split_calls = 0  # chat calls sent to the split llama-server
        self.split_waits = 0  # of those, the ones that had to wait for cores
        self.drain_waits = 0  # chats for the main one that waited for the split one to drain
        self._split_waiting = 0
        self._drain_since: float | None = None  # when the first chat began to wait for a drain
        self._drain_gave_up = False  # its grace passed; until the split one has no chat left
        self._engine: Threaded | None = None
        self._server: Upstream | None = None
        self._split: Upstream | None = None

    @property
    def waiting(self) -> int:
        return self.gate.waiting + self._split_waiting

    @property
    def waits(self) -> int:
        return self.gate.waits + self.split_waits + self.drain_waits

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
            self.gate.attach(server=server)  # its chats hold no decision once it stalls
        if split is not None:
            self._split = split

    def stats(self, engine: Any = None) -> dict[str, Any]:
        return {
            **self.gate.stats(),
            "engine_split_threads": self.engine_split,
            "split_calls": self.split_calls,
            "split_waits": self.split_waits,
            "drain_waits": self.drain_waits,
            # Ubatches the engine gave up for a chat, and evaluated again on its share.
            "engine_preempts": engine.preempts if engine is not None else None,
        }

    @contextlib.asynccontextmanager
    async def engine_turn(self, timeout: float | None = None) -> AsyncIterator[None]:
        """A decision's engine job."""
        self.decisions += 1
        try:
            async with self.gate.engine_turn(timeout):
                yield
        finally:
            self.decisions -= 1

    @contextlib.asynccontextmanager
    async def chat_turn(self, timeout: float | None = None) -> AsyncIterator[Upstream | None]:
        """A chat call; yields the llama-server to send it to (None: the main one)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            server, release = await self._take(deadline)
        except Timeout:
            raise no_turn(timeout) from None  # the whole wait, not its last part
        try:
            yield server
        finally:
            await release()

    async def _take(
        self, deadline: float | None
    ) -> tuple[Upstream | None, Callable[[], Awaitable[None]]]:
        """Routes a chat, and holds its place until it is released; routes again when what
        it waited for changed under it (the decisions ended, a chat took the split one)."""
        while True:
            route = self._route()
            if route == "drain":
                await self._drained(deadline)
                continue  # drained, a decision came, or the grace passed: route again
            # After a drain's grace (long or slowly read streams on the split one): beside
            # them, or the main one if the split one is not answering.
            forced = self._drain_gave_up
            if route == "main_anyway":
                route = "main"
            if route == "split":
                self._join_split()
                try:
                    ready = await self._cores_free(deadline, forced)
                except BaseException:
                    self._leave_split()
                    raise
                if ready:
                    self.split_calls += 1
                    return self._split, self._leave_split_async
                self._leave_split()  # the decisions ended while it waited: route again
                continue
            held = self.gate.chat_turn(_left(deadline))
            await held.__aenter__()
            if forced or self._route() == "main":
                return self._server, functools.partial(held.__aexit__, None, None, None)
            # Granted the gate only after a chat went to the split server meanwhile: not
            # the main one's every core beside it.
            await held.__aexit__(None, None, None)

    def _split_ok(self) -> bool:
        # Healthy, not `answering`: one missed probe of a busy server is not a stall.
        split = self._split
        return split is not None and self._engine is not None and split.healthy

    def _route(self) -> str:
        if self._split_ok() and self.decisions > 0:
            return "split"  # both paths busy: divide the cores
        if self.split_chats == 0:
            return "main"  # alone: every core (through the gate, behind any decision)
        if self._drain_gave_up:
            # A drain's grace passed: later chats join the split one's at once (a new wait
            # each would cost every chat its first token), until it has no chat left.
            return "split" if self._split_ok() else "main_anyway"
        return "drain"

    async def _drained(self, deadline: float | None) -> None:
        """Chat alone again (the decisions ended, or the split llama-server stopped answering)
        while chats still run on the split one: the next goes to the main one, every core, but
        never beside those. It waits for them to end, up to DRAIN_GRACE_S from the first chat
        that waited, instead of keeping chat on half the cores for as long as chats overlap;
        a decision that arrives meanwhile ends the wait."""
        if self._drain_since is None:
            self._drain_since = time.monotonic()
        self.drain_waits += 1
        self._split_waiting += 1
        try:
            while self._route() == "drain":
                if time.monotonic() - self._drain_since >= DRAIN_GRACE_S:
                    self._drain_gave_up = True
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    raise Timeout("drain", limit=0.0)
                await asyncio.sleep(self.poll_s)
        finally:
            self._split_waiting -= 1

    def _join_split(self) -> None:
        self.split_chats += 1
        self._set_engine_threads()  # at once: the ubatch in progress is preempted

    def _leave_split(self) -> None:
        self.split_chats -= 1
        if self.split_chats == 0:
            self._drain_since, self._drain_gave_up = None, False  # drained: a fresh start
        self._set_engine_threads()

    async def _leave_split_async(self) -> None:
        self._leave_split()

    def _set_engine_threads(self) -> None:
        if self._engine is not None:
            self._engine.set_threads(self.engine_split if self.split_chats else 0)

    def _free(self) -> bool:
        """No chat on the main llama-server, and the engine not on more than its share."""
        engine = self._engine
        engine_ok = engine is None or engine.threads_now <= self.engine_split
        return self.gate.shared_holders == 0 and engine_ok

    async def _cores_free(self, deadline: float | None, forced: bool = False) -> bool:
        """Waits until the cores a split-server chat needs are free: True. False: while it
        waited, the decisions ended or the split one stopped answering (route again; not for
        a chat sent there after the drain grace)."""
        if self._free():
            return True
        # Polled: the engine's thread count changes in C++ (its ubatch in progress preempted at
        # a graph node), with no event to wait on; milliseconds, or the main llama-server's
        # chats.
        self.split_waits += 1
        self._split_waiting += 1
        try:
            while not self._free():
                if not forced and self._route() != "split":
                    return False
                if deadline is not None and time.monotonic() >= deadline:
                    raise Timeout("cores", limit=0.0)
                await asyncio.sleep(self.poll_s)
            return True
        finally:
            self._split_waiting -= 1


def _left(deadline: float | None) -> float | None:
    """What is left of a call's deadline for its next wait."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())
