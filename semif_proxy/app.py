"""The aiohttp application factory: wiring only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from semif_proxy import auth, native
from semif_proxy.admission import Admission
from semif_proxy.cpu_gate import CpuGate
from semif_proxy.engine import DecisionEngine
from semif_proxy.keys import (
    CHAT_ADMISSION,
    DECISION_ADMISSION,
    ENGINE,
    GATE,
    LLAMA,
    METRICS,
    SETTINGS,
    STARTUP,
    THREADS,
    UPSTREAM,
    Startup,
)
from semif_proxy.llama_args import with_defaults
from semif_proxy.llama_server import LlamaServer, LlamaServerError, Supervision
from semif_proxy.metrics import Metrics
from semif_proxy.middleware import request_middleware
from semif_proxy.routes import decisions, health, invocations, playground, proxy, systemone
from semif_proxy.settings import Settings

log = logging.getLogger("semif_proxy.app")


def _fatal(app: web.Application, what: str, exc: BaseException) -> None:
    message = f"{what} failed to start: {exc}"
    log.error(message, extra={"event": "startup_failed", "error": str(exc)})
    app[STARTUP].errors.append(message)
    app[STARTUP].on_fatal()


async def _load_engine(app: web.Application) -> None:
    try:
        engine = await DecisionEngine.start(app[SETTINGS], app[THREADS].engine)
    except Exception as exc:  # any load failure ends the process: nothing to serve
        _fatal(app, "the decision engine", exc)
        return
    app[ENGINE] = engine
    log.info("decision engine ready", extra={"event": "engine_ready", **engine.model_info})


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    # Loaded in the background: the port opens at once and /ping says 503 until it is ready.
    app[ENGINE] = None
    task = asyncio.create_task(_load_engine(app)) if app[SETTINGS].decisions else None
    yield
    if task is not None:
        await asyncio.shield(task)  # a load in progress cannot be interrupted; let it end
    engine = app[ENGINE]
    if engine is not None:
        await asyncio.get_running_loop().run_in_executor(None, engine.close)


async def _start_llama(app: web.Application, server: LlamaServer) -> None:
    try:
        await server.start()
    except Exception as exc:
        _fatal(app, "llama-server", exc)


async def _llama_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    app[LLAMA] = None
    server = None
    task = None
    if settings.chat:
        binary = native.llama_server_path(settings.llama_server_binary)
        if binary is None:
            raise LlamaServerError("no llama-server binary (bundled, $SEMIF_LLAMA_SERVER or PATH)")
        args = with_defaults(settings.llama_server_args, app[THREADS].llama_server)
        supervision = Supervision(
            start_timeout=settings.llama_server_start_timeout,
            probe_interval=settings.health_interval,
            probe_timeout=settings.health_timeout,
            max_failed_probes=settings.max_failed_probes,
        )
        server = LlamaServer(binary, settings.model_path, settings.upstream_port, args, supervision)
        app[LLAMA] = server  # state "stopped"/"starting": /ping says 503 until it is healthy
        task = asyncio.create_task(_start_llama(app, server))
    yield
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if server is not None:
        await server.stop()


async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        app[UPSTREAM] = session
        yield


def create_app(settings: Settings, on_fatal: Callable[[], None] | None = None) -> web.Application:
    """on_fatal runs when the engine or llama-server cannot start (the CLI stops the process)."""
    app = web.Application(
        middlewares=[request_middleware, auth.middleware(settings)],
        client_max_size=settings.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[THREADS] = settings.threads
    app[GATE] = CpuGate(enabled=app[THREADS].sharing == "gate")
    app[METRICS] = Metrics()
    app[STARTUP] = Startup(on_fatal=on_fatal or (lambda: None))
    app[DECISION_ADMISSION] = Admission("decision", settings.max_in_flight, settings.max_queue)
    app[CHAT_ADMISSION] = Admission("chat", settings.max_in_flight, settings.max_queue)
    app.cleanup_ctx.extend([_upstream_ctx, _engine_ctx, _llama_ctx])
    health.register_gauges(app)
    app.router.add_get("/ping", health.ping)
    app.router.add_get("/health", health.health)
    app.router.add_get("/metrics", health.metrics)
    app.router.add_post("/invocations", invocations.invocations)
    app.router.add_post("/v1/decisions", decisions.decisions)
    app.router.add_post("/v1/systemone", systemone.systemone_route)
    app.router.add_get("/v1/models", systemone.models_route)
    if settings.playground:
        playground.register(app)
    app.router.add_route("*", "/{tail:.*}", proxy.passthrough)
    return app
