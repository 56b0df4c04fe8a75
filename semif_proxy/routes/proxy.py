"""Everything that is not ours goes to llama-server unchanged, streaming included."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import aiohttp
from aiohttp import web

from semif_proxy.bodies import parse_json, read_limited
from semif_proxy.errors import NotFound, Unavailable, UpstreamError
from semif_proxy.keys import CHAT_ADMISSION, LLAMA, SETTINGS, UPSTREAM
from semif_proxy.middleware import REQUEST_ID

log = logging.getLogger("semif_proxy.proxy")
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
    )
)


def _forward_headers(headers: aiohttp.typedefs.LooseHeaders) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}  # type: ignore[union-attr]


def _upstream_url(request: web.Request, path: str | None = None) -> str:
    server = request.app[LLAMA]
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


async def forward(request: web.Request, body: bytes, path: str | None = None) -> web.StreamResponse:
    """Send the request to llama-server and relay the answer chunk by chunk as it arrives."""
    require_upstream(request)
    session = request.app[UPSTREAM]
    headers = _forward_headers(request.headers)
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=5, sock_read=request.app[SETTINGS].request_timeout
    )
    try:
        upstream = await session.request(
            request.method,
            _upstream_url(request, path),
            data=body or None,
            headers=headers,
            timeout=timeout,
            allow_redirects=False,
        )
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        raise UpstreamError(f"llama-server did not answer: {exc.__class__.__name__}") from None
    streaming = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
    response = web.StreamResponse(
        status=upstream.status, headers=_forward_headers(upstream.headers)
    )
    response.headers["X-Request-Id"] = request[REQUEST_ID]
    try:
        if not streaming:
            try:
                payload = await upstream.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                raise UpstreamError(
                    f"llama-server failed mid-answer: {exc.__class__.__name__}"
                ) from None
            response.content_length = len(payload)
            await response.prepare(request)
            await response.write(payload)
            await response.write_eof()
            return response
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
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


async def passthrough(request: web.Request) -> web.StreamResponse:
    require_upstream(request)
    async with request.app[CHAT_ADMISSION].slot():
        body = await read_limited(request, request.app[SETTINGS].max_body_bytes)
        if body and request.content_type == "application/json":
            parse_json(body)  # malformed JSON is the client's error (400), not llama-server's 500
        return await forward(request, body)
