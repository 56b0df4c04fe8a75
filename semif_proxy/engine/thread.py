"""The one thread that runs every forward pass of a process's engine.

ggml's CPU backend (an OpenMP build, as llama.cpp builds by default) runs a graph in an OpenMP
parallel region, and libgomp keeps a separate pool of worker threads for every thread that ever
started one. Once the process holds more of those workers than it has cores, libgomp spins only
about 100 times at a barrier before it sleeps in the kernel, at every graph node, for the rest
of the process's life. The engine used to load and self-check on one thread (asyncio's default
executor) and decide on another: a second pool, and every decision ran about 10 % slower on
2 cores than it does now (3,637 sleeps in the kernel in four ~900-token decisions
against a handful; README, Benchmarks). So the model is loaded, checked and run on this thread
only, and engines that live side by side in one process (`semif-proxy eval` with several
models) share one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class EngineThread:
    """One worker thread: jobs queue on it in order; `call` waits for one from elsewhere."""

    def __init__(self) -> None:
        self._ident: int | None = None
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="semif-engine", initializer=self._started
        )

    def _started(self) -> None:
        self._ident = threading.get_ident()

    @property
    def current(self) -> bool:
        """The caller is this thread."""
        return threading.get_ident() == self._ident

    def call(self, fn: Callable[[], T]) -> T:
        """fn on this thread, from any thread (directly when already on it: a job that calls
        into the engine must not wait for itself)."""
        if self.current:
            return fn()
        return self.executor.submit(fn).result()

    def shutdown(self) -> None:
        # From the thread itself it cannot wait for its own end.
        self.executor.shutdown(wait=not self.current, cancel_futures=True)
        self._ident = None


__all__ = ["EngineThread"]
