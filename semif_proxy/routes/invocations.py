"""POST /invocations (SageMaker): one endpoint, routed by the shape of the body."""

from __future__ import annotations

import json

from aiohttp import web

from semif_proxy.bodies import read_json_object
from semif_proxy.errors import InvalidRequest
from semif_proxy.keys import CHAT_ADMISSION, DECISION_ADMISSION, SETTINGS
from semif_proxy.middleware import remaining
from semif_proxy.routes import decisions, proxy, systemone

ACCEPTED = (
    '{"messages": [...]} (chat), {"decision": {...}} or {"decisions": [...]} (decisions), '
    '{"state": ..., "questions": {...}} (System One)'
)


async def invocations(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    body, raw = await read_json_object(request, settings.max_body_bytes)
    if "messages" in body:
        async with request.app[CHAT_ADMISSION].slot(remaining(request)):
            return await proxy.forward(request, raw, "/v1/chat/completions")
    if "decision" in body or "decisions" in body:
        async with request.app[DECISION_ADMISSION].slot(remaining(request)):
            return await decisions.answer_decisions(request, body)
    if "state" in body and "questions" in body:
        async with request.app[DECISION_ADMISSION].slot(remaining(request)):
            return await systemone.answer(request, body)
    keys = sorted(body)[:10]
    raise InvalidRequest(
        f"unrecognised body (top-level keys {json.dumps(keys)}); accepted shapes: {ACCEPTED}",
        field="body",
    )
