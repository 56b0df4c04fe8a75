"""The aiohttp application factory: wiring only (what starts and stops is in lifecycle.py)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from semif_proxy.cpu.policy import make_policy
from semif_proxy.http import auth, lifecycle
from semif_proxy.http.admission import Admission
from semif_proxy.http.keys import (
    CHAT_ADMISSION,
    CPU_POLICY,
    DECISION_ADMISSION,
    METRICS,
    SETTINGS,
    STARTUP,
    THREAD_PLAN,
    Startup,
)
from semif_proxy.http.metrics import Metrics
from semif_proxy.http.middleware import request_middleware
from semif_proxy.http.routes import (
    batch_transform,
    decisions,
    health,
    invocations,
    playground,
    proxy,
    systemone,
)
from semif_proxy.settings import Settings


def create_app(settings: Settings, on_fatal: Callable[[], None] | None = None) -> web.Application:
    """on_fatal runs when the engine or llama-server cannot start (the CLI stops the process)."""
    app = web.Application(
        middlewares=[request_middleware, auth.middleware(settings)],
        client_max_size=settings.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[THREAD_PLAN] = settings.thread_plan
    app[CPU_POLICY] = make_policy(app[THREAD_PLAN])
    app[METRICS] = Metrics()
    app[STARTUP] = Startup(on_fatal=on_fatal or (lambda: None))
    app[DECISION_ADMISSION] = Admission("decision", settings.max_in_flight, settings.max_queue)
    app[CHAT_ADMISSION] = Admission("chat", settings.max_in_flight, settings.max_queue)
    app.cleanup_ctx.extend(
        [lifecycle.upstream_ctx, lifecycle.layout_ctx, lifecycle.engine_ctx, lifecycle.llama_ctx]
    )
    app.on_shutdown.append(lifecycle.stop_measuring)
    health.register_gauges(app)
    app.router.add_get("/ping", health.ping)
    app.router.add_get("/health", health.health)
    app.router.add_get("/metrics", health.metrics)
    app.router.add_post("/invocations", invocations.invocations)
    app.router.add_get("/execution-parameters", batch_transform.execution_parameters_route)
    app.router.add_post("/v1/decisions", decisions.decisions)
    app.router.add_post("/v1/systemone", systemone.systemone_route)
    app.router.add_post("/v1/systemone/batch", systemone.batch_route)
    app.router.add_get("/v1/models", systemone.models_route)
    app.on_response_prepare.append(systemone.tag_request_id)  # x-typesafe-request-id
    if settings.playground:
        playground.register(app)
    app.router.add_route("*", "/{tail:.*}", proxy.passthrough)
    return app
