"""GET /ping (SageMaker readiness), GET /health (details), GET /metrics (Prometheus)."""

from __future__ import annotations

import os
from typing import Any

from aiohttp import web

from semif_proxy import __version__
from semif_proxy.engine import native
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


def _status(app: web.Application) -> tuple[bool, dict[str, Any]]:
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
    ready, parts = _status(request.app)
    return web.json_response(
        {"status": "ok" if ready else "unavailable", **parts}, status=200 if ready else 503
    )


async def health(request: web.Request) -> web.Response:
    app = request.app
    ready, parts = _status(app)
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
        body["prefix_cache"] = {
            "entries": len(engine.cache),
            "bytes": engine.cache.size_bytes,
            **vars(engine.cache.stats),
        }
        # Split vs one-piece letter logits on this libllama, compared at load (engine.py);
        # null when the letter check already refused the model.
        body["exactness_check"] = engine.exactness.as_dict() if engine.exactness else None
    return web.json_response(body, status=200 if ready else 503)


def register_gauges(app: web.Application) -> None:
    metrics = app[METRICS]

    def engine_attr(fn: Any) -> Any:
        def value() -> float:
            engine = app[ENGINE].engine
            return float(fn(engine)) if engine is not None else 0.0

        return value

    metrics.gauge(
        "semif_engine_tokens_evaluated_total", engine_attr(lambda e: e.core.tokens_evaluated)
    )
    # 1 while a job runs on the engine thread: what "the request is in the engine now" means.
    metrics.gauge("semif_engine_job_running", engine_attr(lambda e: e.job_running))
    metrics.gauge("semif_engine_jobs_aborted_total", engine_attr(lambda e: e.aborted_jobs))
    metrics.gauge("semif_prefix_cache_hits_total", engine_attr(lambda e: e.cache.stats.hits))
    metrics.gauge("semif_prefix_cache_misses_total", engine_attr(lambda e: e.cache.stats.misses))
    metrics.gauge("semif_prefix_cache_bytes", engine_attr(lambda e: e.cache.size_bytes))
    metrics.gauge("semif_decision_queue_depth", lambda: float(app[DECISION_ADMISSION].waiting))
    metrics.gauge("semif_decision_running", lambda: float(app[DECISION_ADMISSION].running))
    metrics.gauge("semif_decision_rejected_total", lambda: float(app[DECISION_ADMISSION].rejected))
    metrics.gauge("semif_chat_queue_depth", lambda: float(app[CHAT_ADMISSION].waiting))
    metrics.gauge("semif_chat_running", lambda: float(app[CHAT_ADMISSION].running))
    metrics.gauge(
        "semif_llama_server_restarts_total",
        lambda: float(app[LLAMA].restarts) if app.get(LLAMA) is not None else 0.0,
    )
    metrics.gauge("semif_cpu_gate_waiting", lambda: float(app[CPU_POLICY].waiting))
    metrics.gauge("semif_cpu_gate_waits_total", lambda: float(app[CPU_POLICY].waits))
    metrics.gauge(
        "semif_llama_server_unresponsive_kills_total",
        lambda: float(app[LLAMA].unresponsive_kills) if app.get(LLAMA) is not None else 0.0,
    )


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        text=request.app[METRICS].render(),
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )
