"""POST /v1/systemone and GET /v1/models: the TypeSafe System One API on our engine."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from semif_proxy import systemone
from semif_proxy.bodies import read_json_object
from semif_proxy.keys import DECISION_ADMISSION, SETTINGS
from semif_proxy.middleware import remaining
from semif_proxy.routes import proxy
from semif_proxy.routes.decisions import require_engine, run_on_engine


async def answer(request: web.Request, body: dict[str, Any]) -> web.Response:
    engine = require_engine(request)
    settings = request.app[SETTINGS]
    planned = systemone.plan(body, settings, engine.sha256)
    response = await run_on_engine(
        request, lambda: systemone.answer(engine, planned, strict=settings.strict)
    )
    request["tokens"] = response["usage"]["input_tokens"]
    return web.json_response(response)


async def systemone_route(request: web.Request) -> web.Response:
    require_engine(request)
    async with request.app[DECISION_ADMISSION].slot(remaining(request)):
        body, _ = await read_json_object(request, request.app[SETTINGS].max_body_bytes)
        return await answer(request, body)


async def models_route(request: web.Request) -> web.StreamResponse:
    if not request.app[SETTINGS].decisions:
        return await proxy.passthrough(request)  # chat-only: llama-server's own list
    engine = require_engine(request)
    listing = systemone.models_listing(request.app[SETTINGS].model_path, engine.sha256)
    return web.json_response(listing)
