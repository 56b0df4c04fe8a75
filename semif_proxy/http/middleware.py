"""Request id and deadline, the one error middleware, metrics and the per-request JSON log
line."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web

from semif_proxy.errors import ApiError, internal_error
from semif_proxy.http import deadline
from semif_proxy.http.keys import METRICS

log = logging.getLogger("semif_proxy.access")
REQUEST_ID = web.RequestKey("request_id", str)
# perf_counter() at arrival, the request's route label in the metrics (fixed set, metrics.py),
# and whether its first upstream chunk was timed (routes/proxy.first_chunk).
STARTED = web.RequestKey("started", float)
METRICS_ROUTE = web.RequestKey("metrics_route", str)
FIRST_CHUNK = web.RequestKey("first_chunk", bool)
# The prompt tokens the request counted (its route sets it; the access log and metrics read it).
TOKENS = web.RequestKey("tokens", int)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(error: ApiError, request_id: str) -> web.Response:
    body = error.body()
    if "error" in body:
        body["error"]["request_id"] = request_id
    return web.json_response(body, status=error.status, headers=error.headers)


def _route_name(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


@web.middleware
async def request_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    if len(request_id) > 128 or not request_id.isprintable():
        request_id = uuid.uuid4().hex
    request[REQUEST_ID] = request_id
    deadline.start(request)
    metrics = request.app[METRICS]
    resource = request.match_info.route.resource
    metrics_route = metrics.route_label(
        resource.canonical if resource is not None else None, request.raw_path
    )
    request[METRICS_ROUTE] = metrics_route
    metrics.in_flight.inc()
    start = request[STARTED] = time.perf_counter()
    status = 500
    try:
        try:
            response = await handler(request)
        except ApiError as exc:
            response = error_response(exc, request_id)
        except web.HTTPRequestEntityTooLarge as exc:
            response = error_response(
                ApiError(f"body is over the limit of {exc.max_size} bytes", field="body"),
                request_id,
            )
            response.set_status(413)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            kind = "not_found" if exc.status == 404 else "http_error"
            err = ApiError(exc.reason or "error")
            err.status, err.type = exc.status, kind
            response = error_response(err, request_id)
            response.set_status(exc.status)
        except asyncio.CancelledError:
            status = 499  # client went away
            raise
        except Exception:
            log.exception("unhandled error", extra={"request_id": request_id})
            response = error_response(internal_error(), request_id)
        if not response.prepared:
            response.headers["X-Request-Id"] = request_id
        status = response.status
        return response
    finally:
        elapsed = time.perf_counter() - start
        metrics.in_flight.dec()
        route = _route_name(request)
        # Labels from fixed sets only (metrics.py): the method and route a client sent are not.
        metrics.observe_request(metrics_route, request.method, status, elapsed, request.get(TOKENS))
        log.info(
            "request",
            extra={
                "request_id": request_id,
                "method": request.method,
                "route": route,
                "path": request.path,
                "status": status,
                "latency_ms": round(elapsed * 1000, 2),
                "tokens": request.get(TOKENS),
            },
        )
