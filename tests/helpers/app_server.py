"""The application in this process: `create_app` with the real engine and the real model (and,
with chat on, the real llama-server child its lifecycle starts), served on a free loopback port
by an event loop on a thread of its own, behind ProxyProcess's interface (url, port, call,
metric, log_lines, stop). A test that checks what the server answers (the HTTP contract) drives
it as it drove the process, byte for byte over a real socket, with any client (urllib, the
TypeSafe SDK, http.client, `semif-proxy eval`), and skips the process's interpreter start and
imports. What only a process has (its argv, exit code, signals, stderr, memory, `serve`'s own
start-up lines) stays with ProxyProcess.

The server runs as `semif-proxy serve` runs it (cli/serve.py): the settings read from the same
variables, aiohttp's AppRunner with handler cancellation, no access log, and the shutdown grace;
stop() is the graceful shutdown that SIGTERM starts there, and returns serve's exit code (3 when
a background load failed, else 0)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from semif_proxy.http.app import create_app
from semif_proxy.http.keys import LLAMA, STARTUP
from semif_proxy.http.routes.health import readiness
from semif_proxy.logs import JsonFormatter
from semif_proxy.settings import Settings, load_settings
from semif_proxy.testing.server import PRESETS, ProxyProcess


class AppServer(ProxyProcess):
    """AppServer(model, env, preset="decisions", log_path=None): `env` and `preset` as for
    ProxyProcess (the same variables, the same test defaults); with log_path, the JSON lines
    the app logs while it runs go there, as the process writes them (log_lines())."""

    def __init__(
        self,
        model: Path | None,
        env: dict[str, str | None] | None = None,
        *,
        preset: str = "decisions",
        log_path: Path | None = None,
    ) -> None:
        super().__init__(model, {**PRESETS[preset], **(env or {})}, log_path=log_path)
        self.command = []  # nothing is run: the app is served here
        self.settings: Settings = load_settings(self.env, model=str(model) if model else None)
        self.app: web.Application | None = None
        self.fatal = threading.Event()  # the app's on_fatal: serve would stop the process
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._loads: set[asyncio.Task[Any]] = set()
        self._log: tuple[logging.Handler, dict[str, int]] | None = None
        self._code: int | None = None

    # -- start ------------------------------------------------------------------------------

    def launch(self) -> AppServer:
        """The port open, the engine (and llama-server) still loading in the background."""
        assert self._loop is None, "started once"
        self._capture_log()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"app-{self.port}", daemon=True
        )
        self._thread.start()
        try:
            self._run(self._open(), 60)
        except BaseException:
            self.stop()
            raise
        return self

    async def _open(self) -> None:
        self.app = create_app(self.settings, on_fatal=self.fatal.set)
        runner = web.AppRunner(
            self.app,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=self.settings.shutdown_grace,
        )
        before = asyncio.all_tasks()
        self._runner = runner
        await runner.setup()
        # What runner.setup() left running: the lifecycle's background loads (lifecycle.py).
        self._loads = asyncio.all_tasks() - before - {asyncio.current_task()}
        await web.TCPSite(runner, self.settings.host, self.settings.port).start()

    def wait_ready(self, timeout: float = 120.0) -> AppServer:
        """Until /ping would say 200, woken by the loads themselves: the engine's load ending
        and llama-server's health turning on; fails at once when a load fails (serve would
        exit) or the engine refuses the model, instead of waiting out the timeout."""
        try:
            self._run(self._until_ready(timeout), timeout + 5)
        except BaseException:
            self.stop()
            raise
        return self

    async def _until_ready(self, timeout: float) -> None:
        app = self.app
        assert app is not None
        waits: set[asyncio.Future[Any]] = {t for t in self._loads if not t.done()}
        llama = app.get(LLAMA)
        healthy = None
        if llama is not None:
            healthy = asyncio.ensure_future(llama.until_healthy())
            waits.add(healthy)
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            while True:
                ready, parts = readiness(app)
                if ready:
                    return
                if app[STARTUP].errors:
                    raise RuntimeError(f"the app failed to start: {app[STARTUP].errors}")
                if parts.get("engine", {}).get("state") == "refusing":
                    raise RuntimeError(f"the engine refuses this model: {parts['engine']}")
                left = deadline - asyncio.get_running_loop().time()
                if not waits or left <= 0:
                    raise RuntimeError(f"the app did not become ready: {parts}")
                _, waits = await asyncio.wait(
                    waits, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            if healthy is not None and not healthy.done():
                healthy.cancel()

    # -- stop -------------------------------------------------------------------------------

    def stop(self, sig: int | None = None, timeout: float = 30.0) -> int | None:
        """The graceful shutdown (serve's on SIGTERM; `sig` is not used): in-flight requests
        finish within the grace, llama-server is stopped, the engine closed. serve's exit code:
        3 if a background load failed, else 0. Once stopped, the same code again."""
        del sig
        if self._loop is None or self._code is not None:
            return self._code
        try:
            if self._runner is not None:
                self._run(self._runner.cleanup(), timeout + self.settings.shutdown_grace)
            self._run(self._cancel_rest(), timeout)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            assert self._thread is not None
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._loop.close()
            self._release_log()
            errors = self.app[STARTUP].errors if self.app is not None else ["not started"]
            self._code = 3 if errors else 0
        return self._code

    async def _cancel_rest(self) -> None:
        rest = asyncio.all_tasks() - {asyncio.current_task()}
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)
        await asyncio.get_running_loop().shutdown_asyncgens()

    # -- helpers ----------------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def _capture_log(self) -> None:
        """serve's JSON lines (logs.py), for this server's lifetime: INFO and up from the
        semif_proxy loggers (llama.cpp's own chatter kept at WARNING, as configure_logging
        does). The handler sits on the `semif_proxy` logger, not the root that the tests'
        logging fixture resets; records of other apps of this process would land here too."""
        if self.log_path is None:
            return
        handler = logging.FileHandler(self.log_path, encoding="utf-8")
        handler.setFormatter(JsonFormatter())
        levels = {"semif_proxy": logging.INFO, "semif_proxy.llama": logging.WARNING}
        before = {name: logging.getLogger(name).level for name in levels}
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        logging.getLogger("semif_proxy").addHandler(handler)
        self._log = (handler, before)

    def _release_log(self) -> None:
        if self._log is None:
            return
        handler, before = self._log
        self._log = None
        logging.getLogger("semif_proxy").removeHandler(handler)
        with contextlib.suppress(Exception):
            handler.close()
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)
