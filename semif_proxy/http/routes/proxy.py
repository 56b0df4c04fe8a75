"""The llama-server routes we forward (an allow-list), unchanged, streaming included."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time

import aiohttp
from aiohttp import web

from semif_proxy.errors import NotFound, Unavailable, UpstreamError
from semif_proxy.http.auth import normalise_path, split_target
from semif_proxy.http.bodies import parse_json, read_limited
from semif_proxy.http.deadline import deadline_passed, remaining
from semif_proxy.http.keys import CHAT_ADMISSION, CPU_POLICY, LLAMA, METRICS, SETTINGS, UPSTREAM
from semif_proxy.http.middleware import FIRST_CHUNK, METRICS_ROUTE, REQUEST_ID, STARTED
from semif_proxy.llama_server.supervisor import LlamaServer
from semif_proxy.settings import Settings

log = logging.getLogger("semif_proxy.proxy")

# What llama-server (b11312, tools/server/server.cpp) serves that clients may use: generation,
# embeddings, reranking, tokenizing, its model list and read-only properties. GET /health,
# /metrics and (with decisions on) /v1/models are ours and never reach this table by their plain
# names; a client that spells them oddly gets llama-server's answer or a 404, never a bypass.
UPSTREAM_ROUTES = frozenset(
    [("POST", p) for p in (
        "/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions",
        "/completion", "/v1/responses", "/responses", "/v1/messages", "/infill",
        "/v1/embeddings", "/embeddings", "/embedding", "/v1/rerank", "/rerank",
        "/v1/reranking", "/reranking", "/tokenize", "/detokenize", "/apply-template",
    )]
    + [("GET", p) for p in ("/models", "/health", "/props")]
)  # fmt: skip
# Admin routes change or expose server state (slot save/restore/erase, global properties, LoRA
# scales) and only pass with SEMIF_UPSTREAM_ADMIN=on.
ADMIN_ROUTES = frozenset(
    [("GET", "/slots"), ("POST", "/props"), ("GET", "/lora-adapters"), ("POST", "/lora-adapters")]
)
_ADMIN_SLOT = re.compile(r"/slots/\d+")  # POST /slots/{id}?action=save|restore|erase
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
        "Content-Encoding",
        # The proxy's own API key is not llama-server's business (it has none: llama_args.py).
        "Authorization",
    )
)


def _forward_headers(headers: aiohttp.typedefs.LooseHeaders) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}  # type: ignore[union-attr]


def _upstream_url(request: web.Request, path: str | None, server: LlamaServer | None) -> str:
    # The CPU plan may name the llama-server to use (SEMIF_CPU_SHARING=dynamic); else the one.
    server = server or request.app[LLAMA]
    assert server is not None
    return server.base_url + (path or request.rel_url.path_qs)


def require_upstream(request: web.Request) -> None:
    if not request.app[SETTINGS].chat:
        raise NotFound("chat is disabled on this server (SEMIF_CHAT=off)")
    server = request.app.get(LLAMA)
    if server is None or not server.healthy:
        raise Unavailable("llama-server is not ready (starting or restarting)")


def _sse_error(message: str) -> bytes:
    payload = {"error": {"type": "upstream_error", "message": message}}
    return f"data: {json.dumps(payload)}\n\n".encode()


# Routes that run the model: they take a chat turn from the CPU policy (cpu/policy.py).
# Tokenizing, templates, /props and /models cost nothing worth queueing for.
COMPUTE_PATHS = frozenset(
    p
    for method, p in UPSTREAM_ROUTES
    if method == "POST" and p not in ("/tokenize", "/detokenize", "/apply-template")
)


async def forward(request: web.Request, body: bytes, path: str | None = None) -> web.StreamResponse:
    """Send the request to llama-server and relay the answer chunk by chunk as it arrives.
    A model call holds a shared turn at the CPU gate until its last chunk is relayed."""
    require_upstream(request)
    target = (path or request.rel_url.path).split("?", 1)[0]
    if request.method == "POST" and target in COMPUTE_PATHS:
        async with request.app[CPU_POLICY].chat_turn(remaining(request)) as server:
            return await _relay(request, body, path, server)
    return await _relay(request, body, path)


def first_chunk(request: web.Request, upstream_status: int, stream: bool) -> None:
    """Time to first token: from the request's arrival to the relay's first chunk from
    llama-server, observed once per request (later calls do nothing), for answers only (2xx:
    an error comes back fast and says nothing about generation)."""
    if request.get(FIRST_CHUNK) or STARTED not in request or not 200 <= upstream_status < 300:
        return
    request[FIRST_CHUNK] = True
    elapsed = time.perf_counter() - request[STARTED]
    request.app[METRICS].first_chunk(request[METRICS_ROUTE], stream, elapsed)


async def chat(request: web.Request, body: bytes) -> web.StreamResponse:
    """A chat completion read already (POST /invocations): its place in the chat queue, then
    llama-server's /v1/chat/completions."""
    async with request.app[CHAT_ADMISSION].slot(remaining(request)):
        return await forward(request, body, "/v1/chat/completions")


async def _relay(
    request: web.Request, body: bytes, path: str | None, server: LlamaServer | None = None
) -> web.StreamResponse:
    session = request.app[UPSTREAM]
    headers = _forward_headers(request.headers)
    # Until the answer starts, the request's own deadline applies (a non-streamed completion
    # answers only when it is done); a stream then may take as long as it keeps producing.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=remaining(request))
    try:
        upstream = await session.request(
            request.method,
            _upstream_url(request, path, server),
            data=body or None,
            headers=headers,
            timeout=timeout,
            allow_redirects=False,
        )
    except asyncio.TimeoutError:
        raise deadline_passed(request) from None
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamError(f"llama-server did not answer: {exc.__class__.__name__}") from None
    streaming = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
    response = web.StreamResponse(
        status=upstream.status, headers=_forward_headers(upstream.headers)
    )
    response.headers["X-Request-Id"] = request[REQUEST_ID]
    if upstream.status == 503 and "Retry-After" not in response.headers:
        # llama-server says 503 while it loads (a restart raced this call): retry soon.
        response.headers["Retry-After"] = "2"
    try:
        if not streaming:
            try:
                payload = await asyncio.wait_for(upstream.read(), remaining(request))
            except asyncio.TimeoutError:
                raise deadline_passed(request) from None
            except aiohttp.ClientError as exc:
                raise UpstreamError(
                    f"llama-server failed mid-answer: {exc.__class__.__name__}"
                ) from None
            first_chunk(request, upstream.status, stream=False)  # the whole answer: one chunk
            response.content_length = len(payload)
            await response.prepare(request)
            await response.write(payload)
            await response.write_eof()
            return response
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                first_chunk(request, upstream.status, stream=True)  # time to first token, once
                # write() waits for the socket to drain: the client's pace is the upstream's.
                await response.write(chunk)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            log.warning(
                "upstream stream broke",
                extra={"request_id": request[REQUEST_ID], "error": exc.__class__.__name__},
            )
            with contextlib.suppress(ConnectionError, RuntimeError):
                await response.write(
                    _sse_error(f"llama-server failed mid-stream: {exc.__class__.__name__}")
                )
        with contextlib.suppress(ConnectionError, RuntimeError):
            await response.write_eof()
        return response
    except ConnectionError:
        # The client left: closing our side makes llama-server stop generating.
        log.info("client disconnected", extra={"request_id": request[REQUEST_ID]})
        return response
    finally:
        upstream.close()


def upstream_target(settings: Settings, method: str, raw_target: str) -> str | None:
    """The path (and the client's query) to send llama-server, or None when this method and
    path are not forwarded. Matched on the normalised path, so `//slots`, `/SLOTS` and
    `/%73lots` are all /slots; the normalised path is what goes upstream."""
    path = normalise_path(raw_target)
    route = (method, path)
    allowed = route in UPSTREAM_ROUTES or (
        route == ("GET", "/v1/models") and not settings.decisions
    )
    if not allowed and settings.upstream_admin:
        allowed = route in ADMIN_ROUTES or (method == "POST" and bool(_ADMIN_SLOT.fullmatch(path)))
    if not allowed:
        return None
    _, query = split_target(raw_target)
    return f"{path}?{query}" if query else path


async def passthrough(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    target = upstream_target(settings, request.method, request.raw_path)
    if target is None:
        path, _ = split_target(request.raw_path)
        raise NotFound(f"no route {request.method} {path}", field="path")
    require_upstream(request)
    async with request.app[CHAT_ADMISSION].slot(remaining(request)):
        body = await read_limited(request, settings.max_body_bytes)
        # llama-server reads a body as JSON whatever its Content-Type, and its POST routes
        # need one: malformed, missing or over-deep JSON is the client's error (400), not
        # llama-server's 500 (both found by the fuzz test).
        json_route = ("POST", target.split("?")[0]) in UPSTREAM_ROUTES
        if body or (request.method == "POST" and json_route):
            parse_json(body)
        return await forward(request, body, target)
