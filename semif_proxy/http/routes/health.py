"""GET /ping (SageMaker readiness), GET /health (details), GET /metrics (Prometheus)."""

from __future__ import annotations

import os
from typing import Any

from aiohttp import web

from semif_proxy import __version__
from semif_proxy.engine import native
from semif_proxy.http.auth import normalise_path
from semif_proxy.http.keys import (
    CHAT_ADMISSION,
    CPU_POLICY,
    DECISION_ADMISSION,
    ENGINE,
    LLAMA,
    LLAMA_SECOND,
    METRICS,
    SETTINGS,
    STARTUP,
    THREAD_PLAN,
)
from semif_proxy.http.metrics import CATCH_ALL, CONTENT_TYPE
from semif_proxy.http.routes import proxy
from semif_proxy.llama_server.supervisor import LlamaServer


def _server_status(server: LlamaServer | None) -> dict[str, Any]:
    return {
        "state": server.state if server else "not started",
        "pid": server.pid if server else None,
        "restarts": server.restarts if server else 0,
        "unresponsive_kills": server.unresponsive_kills if server else 0,
        "failed_probes": server.failed_probes if server else 0,
        "healthy": server is not None and server.healthy,
    }


def readiness(app: web.Application) -> tuple[bool, dict[str, Any]]:
    """Ready means every path this server was started with can answer now: decisions when they
    are on (engine loaded and not refusing this model), chat when it is on (llama-server
    answered one of its last two probes). One path down is not ready: SageMaker then holds
    traffic back or replaces the instance, instead of routing calls that would fail."""
    settings = app[SETTINGS]
    parts: dict[str, Any] = {}
    ready = True
    if settings.decisions:
        engine = app[ENGINE].engine
        engine_ok = engine is not None and engine.unavailable_reason is None
        failed = bool(app[STARTUP].errors)
        loading = "failed" if failed else "loading"
        parts["engine"] = {
            "state": "ready" if engine_ok else ("refusing" if engine else loading),
            "reason": engine.unavailable_reason if engine else None,
        }
        ready = ready and engine_ok
    if settings.chat:
        server = app.get(LLAMA)
        # The supervisor probes llama-server in the background; /ping reads its verdict and so
        # answers at once even while llama-server is stalled.
        ok = server is not None and server.healthy
        parts["llama_server"] = _server_status(server)
        split = app.get(LLAMA_SECOND)
        if split is not None:
            # Not part of readiness: while it is down, chat goes to the main one (cpu_dynamic).
            parts["llama_server_split"] = _server_status(split)
            if app[STARTUP].second_not_started:
                parts["llama_server_split"].update(
                    state="not started", why=app[STARTUP].second_not_started
                )
        ready = ready and ok
    if app[STARTUP].errors:
        parts["startup_errors"] = list(app[STARTUP].errors)
    return ready, parts


async def ping(request: web.Request) -> web.Response:
    ready, parts = readiness(request.app)
    return web.json_response(
        {"status": "ok" if ready else "unavailable", **parts}, status=200 if ready else 503
    )


async def health(request: web.Request) -> web.Response:
    app = request.app
    ready, parts = readiness(app)
    engine = app[ENGINE].engine
    body: dict[str, Any] = {
        "status": "ok" if ready else "unavailable",
        "version": __version__,
        "pid": os.getpid(),
        **native.build_info(),
        **parts,
    }
    plan = app[THREAD_PLAN]
    policy = app[CPU_POLICY]
    body["cpu"] = {
        "sharing": plan.sharing,
        "engine_threads": plan.engine,
        "llama_server_threads": plan.llama_server,
        "gate_waiting": policy.waiting,
        "dynamic_fallback": plan.why or None,  # why CPU sharing dynamic became the gate
        **policy.stats(engine),
    }
    if policy.second_server:
        body["cpu"]["llama_server_split_threads"] = plan.llama_server_split
    if engine is not None:
        body["model"] = engine.model_info
        settings = app[SETTINGS]
        body["default_readout"] = settings.readout.shown()
        body["default_normalization"] = settings.normalization.shown()
        body["default_bias_correction"] = settings.bias_correction.shown()
        body["prefix_cache"] = {
            "entries": len(engine.cache),
            "bytes": engine.cache.size_bytes,
            **vars(engine.cache.stats),
        }
        # Split vs one-piece letter logits on this libllama, compared at load (engine/exactness.py);
        # null when the letter check already refused the model.
        body["exactness_check"] = engine.exactness.as_dict() if engine.exactness else None
    return web.json_response(body, status=200 if ready else 503)


def register_gauges(app: web.Application) -> None:
    """What /metrics reads when scraped (counts kept elsewhere, queue depths), the queue-wait
    observers, and the fixed label sets for routes (metrics.py)."""
    metrics = app[METRICS]
    metrics.forwarded = frozenset(p for _, p in proxy.UPSTREAM_ROUTES | proxy.ADMIN_ROUTES)
    metrics.chat_routes = proxy.COMPUTE_PATHS | {"/invocations"}
    metrics.normalise = normalise_path

    async def freeze_routes(app: web.Application) -> None:
        # Every route is added by now, and the router can no longer change: a fixed set.
        own = {resource.canonical for resource in app.router.resources()}
        metrics.own_routes = frozenset(own - {CATCH_ALL})

    app.on_startup.append(freeze_routes)
    for admission in (app[DECISION_ADMISSION], app[CHAT_ADMISSION]):
        admission.on_wait = metrics.queue_waited(admission.name)

    def engine_attr(fn: Any) -> Any:
        def value() -> float:
            engine = app[ENGINE].engine
            return float(fn(engine)) if engine is not None else 0.0

        return value

    def llama_attr(name: str) -> Any:
        return lambda: float(getattr(app[LLAMA], name)) if app.get(LLAMA) is not None else 0.0

    metrics.counter(
        "semif_engine_tokens_evaluated_total",
        engine_attr(lambda e: e.core.tokens_evaluated),
        "Tokens the decision engine has run forward passes on.",
    )
    # 1 while a job runs on the engine thread: what "the request is in the engine now" means.
    metrics.gauge(
        "semif_engine_job_running",
        engine_attr(lambda e: e.job_running),
        "1 while a job runs on the decision engine's thread.",
    )
    metrics.counter(
        "semif_engine_jobs_aborted_total",
        engine_attr(lambda e: e.aborted_jobs),
        "Engine jobs stopped before their end (deadline passed).",
    )
    metrics.counter(
        "semif_prefix_cache_hits_total",
        engine_attr(lambda e: e.cache.stats.hits),
        "Prefix cache hits.",
    )
    metrics.counter(
        "semif_prefix_cache_misses_total",
        engine_attr(lambda e: e.cache.stats.misses),
        "Prefix cache misses.",
    )
    metrics.gauge(
        "semif_prefix_cache_bytes",
        engine_attr(lambda e: e.cache.size_bytes),
        "Bytes the prefix cache holds.",
    )
    for queue, key in (("decision", DECISION_ADMISSION), ("chat", CHAT_ADMISSION)):
        admission = app[key]
        metrics.gauge(
            f"semif_{queue}_queue_depth",
            lambda a=admission: float(a.waiting),
            f"Requests waiting in the {queue} queue.",
        )
        metrics.gauge(
            f"semif_{queue}_running",
            lambda a=admission: float(a.running),
            f"Requests holding a {queue} running place.",
        )
        metrics.counter(
            f"semif_{queue}_rejected_total",
            lambda a=admission: float(a.rejected),
            f"Requests refused at once because the {queue} queue was full (429).",
        )
    metrics.counter(
        "semif_llama_server_restarts_total",
        llama_attr("restarts"),
        "Restarts of llama-server by its supervisor.",
    )
    metrics.counter(
        "semif_llama_server_unresponsive_kills_total",
        llama_attr("unresponsive_kills"),
        "llama-server processes killed for not answering their health probes.",
    )
    metrics.gauge(
        "semif_cpu_gate_waiting",
        lambda: float(app[CPU_POLICY].waiting),
        "Calls waiting for their turn at the CPU gate.",
    )
    metrics.counter(
        "semif_cpu_gate_waits_total",
        lambda: float(app[CPU_POLICY].waits),
        "Calls that had to wait at the CPU gate.",
    )


async def metrics(request: web.Request) -> web.Response:
    response = web.Response(
        body=request.app[METRICS].render(), headers={"X-Content-Type-Options": "nosniff"}
    )
    response.headers["Content-Type"] = CONTENT_TYPE  # prometheus_client's, version included
    return response
