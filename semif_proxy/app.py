"""The aiohttp application factory: wiring only (what starts and stops is in lifecycle.py)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from semif_proxy import auth, lifecycle
from semif_proxy.admission import Admission
from semif_proxy.cpu_dynamic import CpuDynamicSplit
from semif_proxy.cpu_gate import CpuGate
from semif_proxy.cpu_slicer import CpuSlicer
from semif_proxy.keys import (
    CHAT_ADMISSION,
    DECISION_ADMISSION,
    GATE,
    METRICS,
    SETTINGS,
    STARTUP,
    THREADS,
    Startup,
)
from semif_proxy.metrics import Metrics
from semif_proxy.middleware import request_middleware
from semif_proxy.routes import decisions, health, invocations, playground, proxy, systemone
from semif_proxy.settings import Settings


def create_app(settings: Settings, on_fatal: Callable[[], None] | None = None) -> web.Application:
    """on_fatal runs when the engine or llama-server cannot start (the CLI stops the process)."""
    app = web.Application(
        middlewares=[request_middleware, auth.middleware(settings)],
        client_max_size=settings.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[THREADS] = settings.threads
    sharing = app[THREADS].sharing
    if sharing == "slice":
        app[GATE] = CpuSlicer(settings.cpu_slice_ms / 1000, settings.cpu_chat_share)
    elif sharing == "dynamic":
        app[GATE] = CpuDynamicSplit(app[THREADS].engine_split)
    else:
        app[GATE] = CpuGate(enabled=sharing == "gate")
    app[METRICS] = Metrics()
    app[STARTUP] = Startup(on_fatal=on_fatal or (lambda: None))
    app[DECISION_ADMISSION] = Admission("decision", settings.max_in_flight, settings.max_queue)
    app[CHAT_ADMISSION] = Admission("chat", settings.max_in_flight, settings.max_queue)
    app.cleanup_ctx.extend(
        [lifecycle.upstream_ctx, lifecycle.engine_ctx, lifecycle.llama_ctx, lifecycle.cpu_ctx]
    )
    health.register_gauges(app)
    app.router.add_get("/ping", health.ping)
    app.router.add_get("/health", health.health)
    app.router.add_get("/metrics", health.metrics)
    app.router.add_post("/invocations", invocations.invocations)
    app.router.add_get("/execution-parameters", invocations.execution_parameters)
    app.router.add_post("/v1/decisions", decisions.decisions)
    app.router.add_post("/v1/systemone", systemone.systemone_route)
    app.router.add_post("/v1/systemone/batch", systemone.batch_route)
    app.router.add_get("/v1/models", systemone.models_route)
    app.on_response_prepare.append(systemone.tag_request_id)  # x-typesafe-request-id
    if settings.playground:
        playground.register(app)
    app.router.add_route("*", "/{tail:.*}", proxy.passthrough)
    return app
