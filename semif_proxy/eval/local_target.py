"""The eval target that is a GGUF in this process: the same services the routes run, without
HTTP, on one engine thread shared by every model evaluated."""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from semif_proxy.engine.thread import EngineThread
from semif_proxy.eval.targets import Answer, Failure, TargetError, read_answer


@functools.cache
def shared_engine_thread() -> EngineThread:
    """One engine thread for every model this process evaluates: one OpenMP pool each would
    slow them all (engine/thread.py)."""
    return EngineThread()


@dataclass
class LocalTarget:
    """The GGUF in this process: the same services the routes run, without HTTP."""

    name: str
    path: Path
    engine: Any = None
    settings: Any = None
    # The engine answers one request at a time: rows asked at once wait here, not in it.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(cls, name: str, path: Path) -> LocalTarget:
        from semif_proxy.engine.worker import DecisionEngine
        from semif_proxy.settings import SettingsError, load_settings

        if not path.is_file():
            raise TargetError(f"{name}: no such model file")
        try:
            settings = load_settings(model=str(path), chat=False)
        except SettingsError as exc:
            raise TargetError(f"{name}: {exc}") from None
        try:
            engine = DecisionEngine.load(settings, thread=shared_engine_thread())
        except (RuntimeError, ValueError) as exc:  # not a GGUF, an architecture libllama lacks
            raise TargetError(f"{name}: the model does not load: {exc}") from None
        return cls(name, path, engine, settings)

    def ask(self, route: str, body: dict[str, Any]) -> Answer | Failure:
        from semif_proxy.api import services
        from semif_proxy.errors import ApiError

        # The server's count limits do not bind a run on one's own machine (as `decide`).
        service = (
            services.Decisions(limited=False) if route == "decisions" else services.SystemOne()
        )
        with self.lock:
            start = time.perf_counter()
            try:
                planned = service.plan(body, self.settings, self.engine.sha256)
                response = service.answer(self.engine, planned).body
            except ApiError as exc:
                seconds = time.perf_counter() - start
                return Failure(str(exc), seconds, exc.status, exc.body())
            return read_answer(route, response, time.perf_counter() - start)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "local", "model": str(self.path)}

    def interrupt(self) -> None:
        pass  # the row in progress finishes (seconds); close() waits for it

    def close(self) -> None:
        with self.lock:
            if self.engine is not None:
                self.engine.close()
                self.engine = None
