"""Jobs on the engine thread: callers queue in arrival order, a cancelled caller takes its work
with it, and the CPU policy steers the engine's thread count between and during ubatches. A
part of DecisionEngine (worker.py), which holds what these read."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from semif_proxy.engine import native
    from semif_proxy.engine.thread import EngineThread

log = logging.getLogger("semif_proxy.engine")
T = TypeVar("T")


class EngineJobs:
    core: native.Engine
    thread: EngineThread
    _job_lock: threading.Lock
    _current_job: object | None
    _abort_requested_at: float | None
    aborted_jobs: int

    # -- a dynamic split of the CPU (cpu/dynamic.py) -----------------------------------------

    def set_threads(self, n: int) -> None:
        """Threads for the engine's ubatches; 0: the count the engine was loaded with. A lower
        count preempts the ubatch in progress, which runs again on it; a higher one applies
        from the next ubatch (csrc/engine.h)."""
        self.core.set_threads(n)

    @property
    def preempts(self) -> int:
        """Ubatches preempted by a lower thread count and evaluated again."""
        return self.core.preempts

    @property
    def threads_now(self) -> int:
        """Threads of the ubatch in progress; 0 when none runs."""
        return self.core.threads_now

    @property
    def job_running(self) -> bool:
        """A job is on the engine thread right now (queued ones are not counted)."""
        return self._current_job is not None

    async def run(self, fn: Callable[[], T]) -> T:
        """Run fn on the engine thread; callers queue there in arrival order.

        A caller that is cancelled (its client hung up, its deadline passed) takes its work
        with it: a queued job never starts, a running one stops at the next graph node, so the
        next request starts at once instead of after a prefill nobody will read."""
        job = object()
        future = asyncio.get_running_loop().run_in_executor(
            self.thread.executor, self._job, job, fn
        )
        try:
            return await future
        except asyncio.CancelledError:
            self._abort(job)
            raise

    def _job(self, job: object, fn: Callable[[], T]) -> T:
        with self._job_lock:
            self._current_job = job
            self._abort_requested_at = None
            self.core.clear_abort()
        try:
            return fn()
        finally:
            with self._job_lock:
                self._current_job = None
                if self._abort_requested_at is not None:
                    late = time.monotonic() - self._abort_requested_at
                    log.info(
                        "aborted engine job ended",
                        extra={"event": "engine_job_stopped", "after_abort_seconds": late},
                    )

    def _abort(self, job: object) -> None:
        with self._job_lock:
            if self._current_job is job:
                self.core.abort()
                self.aborted_jobs += 1
                self._abort_requested_at = time.monotonic()
                log.info("engine job aborted", extra={"event": "engine_abort"})
