"""Bounded admission per path: at most N running, at most M waiting, the rest refused at once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from semif_proxy.errors import Overloaded


class Admission:
    def __init__(self, name: str, max_in_flight: int, max_queue: int) -> None:
        self.name = name
        self.max_in_flight = max_in_flight
        self.max_queue = max_queue
        self.running = 0
        self.waiting = 0
        self.rejected = 0
        self._semaphore = asyncio.Semaphore(max_in_flight)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self.running >= self.max_in_flight and self.waiting >= self.max_queue:
            self.rejected += 1
            raise Overloaded(
                f"{self.name} queue is full ({self.max_in_flight} running, {self.max_queue} "
                "waiting); retry later",
                limit=self.max_queue,
            )
        self.waiting += 1
        try:
            await self._semaphore.acquire()  # asyncio.Semaphore wakes waiters in FIFO order
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._semaphore.release()
