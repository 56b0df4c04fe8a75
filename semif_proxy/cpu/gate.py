"""One compute job at a time on the CPU, so each gets every core.

The engine and llama-server both run with all cores. A decision holds the gate alone; chat
requests hold it together (llama-server batches concurrent requests in one forward pass, so they
share the cores well). When both kinds wait, the gate alternates: after a decision, every chat
that waits goes in; once those chats are done, the next decision. So a chat waits for at most
one decision and a decision for at most the chats already running; new chats queue behind a
waiting decision, and a stream of chats cannot starve decisions (nor the reverse). Two jobs
run side by side on shared cores would each take about twice as long; one after the other, the
first answer comes about twice as early and the second no later.

A chat holds its turn until its last chunk, so a llama-server that stops answering (stopped,
wedged, being killed by its supervisor) would hold every decision behind its chats until the
supervisor's restart or the chats' deadline: a decision that waits for chats looks every
POLL_S whether their llama-server is counted unhealthy (missed probes in a row: one miss of a
busy server is no stall), and then goes beside them (a stalled child computes nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from semif_proxy.errors import Timeout

# How often a decision that waits for chats looks whether their llama-server was counted stalled.
POLL_S = 0.25


def no_turn(timeout: float | None) -> Timeout:
    """The error of a call that waited its whole deadline for the CPU."""
    return Timeout(
        f"waited {timeout:g}s for the CPU without a turn "
        "(SEMIF_REQUEST_TIMEOUT; SageMaker cuts real-time invocations at 60 s)",
        limit=timeout,
    )


class CpuGate:
    """A CpuPolicy (cpu/policy.py): `gate` when enabled; `split` and `none` pass every turn
    at once (the cores are divided by thread counts, or nothing needs guarding)."""

    second_server = False

    def __init__(self, enabled: bool = True, name: str = "gate") -> None:
        self.name = name
        self.enabled = enabled
        self.shared_holders = 0
        self.exclusive_held = False
        self.waits = 0  # acquisitions that had to queue
        self.stalled_passes = 0  # decisions let past the chats of a stalled llama-server
        self._queue: deque[tuple[bool, asyncio.Future[None]]] = deque()
        self._server: Any = None  # the llama-server its chats run on (an Upstream)

    @property
    def waiting(self) -> int:
        return sum(1 for _, fut in self._queue if not fut.done())

    def attach(self, engine: Any = None, server: Any = None, split: Any = None) -> None:
        """Nothing to steer: the gate only orders turns; it watches the llama-server its chats
        run on (`healthy`) so that a stalled one holds no decision back."""
        if server is not None:
            self._server = server

    def stats(self, engine: Any = None) -> dict[str, Any]:
        return {"stalled_chat_passes": self.stalled_passes} if self.enabled else {}

    def _chats_stalled(self) -> bool:
        server = self._server
        return (
            self.shared_holders > 0
            and not self.exclusive_held
            and server is not None
            and not server.healthy
        )

    async def _granted(self, fut: asyncio.Future[None], timeout: float | None) -> None:
        """A decision's wait for its turn; once the chats it waits for are stalled (above) and
        it is the first decision in the queue, it takes the turn beside them."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not fut.done():  # granted in the moment its last wait ended: taken
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise asyncio.TimeoutError
            try:
                await asyncio.wait_for(
                    asyncio.shield(fut), POLL_S if left is None else min(POLL_S, left)
                )
                return
            except asyncio.TimeoutError:
                first = next(
                    (f for exclusive, f in self._queue if exclusive and not f.done()), None
                )
                if fut.done() or first is not fut or not self._chats_stalled():
                    continue
                self._queue = deque(e for e in self._queue if e[1] is not fut)
                self._enter(True)
                self.stalled_passes += 1
                fut.set_result(None)
                return

    @contextlib.asynccontextmanager
    async def engine_turn(self, timeout: float | None = None) -> AsyncIterator[None]:
        async with self._held(True, timeout):
            yield

    @contextlib.asynccontextmanager
    async def chat_turn(self, timeout: float | None = None) -> AsyncIterator[None]:
        async with self._held(False, timeout):
            yield

    @contextlib.asynccontextmanager
    async def _held(self, exclusive: bool, timeout: float | None) -> AsyncIterator[None]:
        if not self.enabled:
            yield
            return
        await self._acquire(exclusive, timeout)
        try:
            yield
        finally:
            self._release(exclusive)

    def _free_for(self, exclusive: bool) -> bool:
        if exclusive:
            return not self.exclusive_held and self.shared_holders == 0
        return not self.exclusive_held

    def _enter(self, exclusive: bool) -> None:
        if exclusive:
            self.exclusive_held = True
        else:
            self.shared_holders += 1

    def _exclusive_waiting(self) -> bool:
        return any(exclusive and not fut.done() for exclusive, fut in self._queue)

    async def _acquire(self, exclusive: bool, timeout: float | None) -> None:
        if exclusive:
            may_enter = self._free_for(True) and not self.waiting
        else:
            may_enter = self._free_for(False) and not self._exclusive_waiting()
        if may_enter:
            self._enter(exclusive)
            return
        self.waits += 1
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((exclusive, fut))
        try:
            if exclusive and self._server is not None:
                await self._granted(fut, timeout)
            else:
                await asyncio.wait_for(asyncio.shield(fut), timeout)
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self._release(exclusive)  # granted in the very moment the caller gave up
            else:
                fut.cancel()
                self._wake()  # a waiter behind this one may be free to go now
            if isinstance(exc, asyncio.TimeoutError):
                raise no_turn(timeout) from None
            raise

    def _release(self, exclusive: bool) -> None:
        if exclusive:
            self.exclusive_held = False
        else:
            self.shared_holders -= 1
        self._wake(after_exclusive=exclusive)

    def _wake(self, after_exclusive: bool = False) -> None:
        live = [(exclusive, fut) for exclusive, fut in self._queue if not fut.done()]
        self._queue = deque(live)
        if self.exclusive_held or not live:
            return
        shared = [fut for exclusive, fut in live if not exclusive]
        first_exclusive = next((fut for exclusive, fut in live if exclusive), None)
        if (
            self.shared_holders == 0
            and first_exclusive is not None
            and not (after_exclusive and shared)
        ):
            grant = [first_exclusive]
            self.exclusive_held = True
        elif shared and (after_exclusive or first_exclusive is None):
            grant = shared  # the chat phase: every chat that waits
            self.shared_holders += len(shared)
        else:
            return
        granted = {id(fut) for fut in grant}
        self._queue = deque(e for e in self._queue if id(e[1]) not in granted)
        for fut in grant:
            fut.set_result(None)
