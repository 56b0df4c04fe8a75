"""Reading request bodies within the configured limits."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from semif_proxy.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType


def require_json(request: web.Request) -> None:
    if request.content_type not in ("application/json", "application/x-json") and not (
        request.content_type.endswith("+json")
    ):
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, got {request.content_type or 'none'!r}",
            field="Content-Type",
        )


async def read_limited(request: web.Request, limit: int) -> bytes:
    length = request.content_length
    if length is not None and length > limit:
        raise PayloadTooLarge(
            f"body is {length} bytes, over the limit of {limit}",
            field="body",
            bytes=length,
            limit=limit,
        )
    chunks = bytearray()
    try:
        # aiohttp decompresses Content-Encoding (gzip, deflate, zstd) as it reads; the limit
        # applies to the decompressed bytes, so a small compressed bomb stops early too.
        async for chunk in request.content.iter_chunked(64 * 1024):
            chunks += chunk
            if len(chunks) > limit:
                raise PayloadTooLarge(
                    f"body is over the limit of {limit} bytes (after decompression)",
                    field="body",
                    limit=limit,
                )
    except RequestPayloadError as exc:
        encoding = request.headers.get("Content-Encoding", "identity")
        raise InvalidRequest(
            f"body could not be read (Content-Encoding: {encoding}): {exc.__cause__ or exc}",
            field="body",
        ) from None
    return bytes(chunks)


def _no_constants(name: str) -> Any:
    # Python's json accepts NaN and Infinity; JSON (and llama-server's parser) does not.
    raise ValueError(f"{name} is not a JSON value")


# Deeper than any real request; every later step (validation, rendering) then stays shallow.
MAX_DEPTH = 64


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, walked with a stack (no recursion)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_json(raw: bytes) -> Any:
    """Strict JSON, or InvalidRequest naming the body."""
    try:
        value = json.loads(raw, parse_constant=_no_constants)
    except RecursionError:
        value = None
        depth = None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}", field="body") from None
    else:
        depth = json_depth(value)
    if depth is None or depth > MAX_DEPTH:
        raise InvalidRequest(
            f"body is nested deeper than {MAX_DEPTH} levels of objects and arrays",
            field="body",
            limit=MAX_DEPTH,
        )
    return value


async def read_json_object(request: web.Request, limit: int) -> tuple[dict[str, Any], bytes]:
    require_json(request)
    raw = await read_limited(request, limit)
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("body must be a JSON object", field="body")
    return body, raw
