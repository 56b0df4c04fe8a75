"""Bounded admission per path: at most N running, at most M waiting, the rest refused at once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from semif_proxy.errors import Overloaded, Timeout


class Admission:
    def __init__(self, name: str, max_in_flight: int, max_queue: int) -> None:
        self.name = name
        self.max_in_flight = max_in_flight
        self.max_queue = max_queue
        self.running = 0
        self.waiting = 0
        self.rejected = 0
        # Called with the seconds each admitted (or timed-out) request waited for its place:
        # the queue-wait histogram (metrics.py; set by health.register_gauges).
        self.on_wait: Callable[[float], None] | None = None
        self._semaphore = asyncio.Semaphore(max_in_flight)

    @property
    def full(self) -> bool:
        """Every running place taken and the queue full: the next request is refused."""
        return self.running >= self.max_in_flight and self.waiting >= self.max_queue

    def refuse(self) -> None:
        self.rejected += 1
        raise Overloaded(
            f"{self.name} queue is full ({self.max_in_flight} running, {self.max_queue} "
            "waiting); retry later",
            limit=self.max_queue,
        )

    @contextlib.asynccontextmanager
    async def slot(self, timeout: float | None = None) -> AsyncIterator[None]:
        """A running place, waited for at most `timeout` seconds (the request's deadline)."""
        if self.full:
            self.refuse()
        self.waiting += 1
        queued = time.perf_counter()
        try:
            # asyncio.Semaphore wakes waiters in FIFO order
            await asyncio.wait_for(self._semaphore.acquire(), timeout)
        except asyncio.TimeoutError:
            raise Timeout(
                f"waited {timeout:g}s in the {self.name} queue without a turn "
                "(SEMIF_REQUEST_TIMEOUT; SageMaker cuts real-time invocations at 60 s)",
                limit=timeout,
            ) from None
        finally:
            self.waiting -= 1
            if self.on_wait is not None:
                self.on_wait(time.perf_counter() - queued)
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._semaphore.release()
