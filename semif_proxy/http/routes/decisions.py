"""POST /v1/decisions: single ({"decision"}) and shared-state ({"decisions"}) requests."""

from __future__ import annotations

from aiohttp import web

from semif_proxy.api.services import SERVICES
from semif_proxy.http import engine_job
from semif_proxy.http.bodies import read_json_object
from semif_proxy.http.keys import SETTINGS


async def decisions(request: web.Request) -> web.Response:
    async with engine_job.admitted(request) as call:
        body, _ = await read_json_object(request, request.app[SETTINGS].max_body_bytes)
        return await call.answer(SERVICES["decisions"], body)
