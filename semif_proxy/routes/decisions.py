"""POST /v1/decisions: single ({"decision"}) and shared-state ({"decisions"}) requests."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from semif_proxy import decisions as service
from semif_proxy.bodies import read_json_object
from semif_proxy.errors import NotFound, Unavailable
from semif_proxy.keys import DECISION_ADMISSION, ENGINE, GATE, SETTINGS
from semif_proxy.middleware import DEADLINE, deadline_passed, remaining

if TYPE_CHECKING:
    from semif_proxy.engine import DecisionEngine


def require_engine(request: web.Request) -> DecisionEngine:
    settings = request.app[SETTINGS]
    if not settings.decisions:
        raise NotFound("decisions are disabled on this server (SEMIF_DECISIONS=off)")
    engine = request.app[ENGINE].engine
    if engine is None:
        raise Unavailable("the decision engine is still loading")
    return engine


async def run_on_engine(request: web.Request, fn: Any) -> Any:
    """Run fn on the engine within what is left of the request's deadline; past it, the job
    is stopped (engine.run aborts it) and the caller gets a 504."""
    engine = require_engine(request)
    remaining = request[DEADLINE] - asyncio.get_running_loop().time()
    if remaining <= 0:
        raise deadline_passed(request)
    # The whole machine for this job (cpu_gate.py: chat calls in flight finish first, new
    # ones wait; cpu_slicer.py: turns with chat calls in flight).
    async with request.app[GATE].exclusive(remaining):
        remaining = request[DEADLINE] - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(engine.run(fn), max(remaining, 0.001))
        except asyncio.TimeoutError:
            raise deadline_passed(request) from None


async def answer_decisions(request: web.Request, body: dict[str, Any]) -> web.Response:
    engine = require_engine(request)
    parsed = service.parse_request(
        body, request.app[SETTINGS].max_decisions, request.app[SETTINGS].max_options
    )
    response, request["tokens"] = await run_on_engine(
        request, lambda: service.answer(engine, parsed)
    )
    return web.json_response(response)


async def decisions(request: web.Request) -> web.Response:
    require_engine(request)
    async with request.app[DECISION_ADMISSION].slot(remaining(request)):
        body, _ = await read_json_object(request, request.app[SETTINGS].max_body_bytes)
        return await answer_decisions(request, body)
