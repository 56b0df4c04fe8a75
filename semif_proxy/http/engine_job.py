"""How a route runs work on the decision engine, the same way on every route: the engine
required once, the job run within what is left of the request's deadline under the CPU
policy's engine turn, with one hop onto the engine thread; and a service's answer rendered."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from semif_proxy.errors import NotFound, Unavailable
from semif_proxy.http.keys import CPU_POLICY, ENGINE, SETTINGS
from semif_proxy.http.middleware import DEADLINE, TOKENS, deadline_passed

if TYPE_CHECKING:
    from semif_proxy.api.services import Service
    from semif_proxy.engine.worker import DecisionEngine

T = TypeVar("T")


def require_engine(request: web.Request) -> DecisionEngine:
    """The loaded engine; 404 where decisions are off, 503 while it loads."""
    if not request.app[SETTINGS].decisions:
        raise NotFound("decisions are disabled on this server (SEMIF_DECISIONS=off)")
    engine = request.app[ENGINE].engine
    if engine is None:
        raise Unavailable("the decision engine is still loading")
    return engine


async def run_job(request: web.Request, engine: DecisionEngine, fn: Callable[[], T]) -> T:
    """fn on the engine thread within what is left of the request's deadline; past it, the job
    is stopped (engine.run aborts it) and the caller gets a 504. The CPU policy decides what
    else runs meanwhile (cpu/policy.py)."""
    remaining = request[DEADLINE] - asyncio.get_running_loop().time()
    if remaining <= 0:
        raise deadline_passed(request)
    async with request.app[CPU_POLICY].engine_turn(remaining):
        remaining = request[DEADLINE] - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(engine.run(fn), max(remaining, 0.001))
        except asyncio.TimeoutError:
            raise deadline_passed(request) from None


async def answer(
    request: web.Request, engine: DecisionEngine, service: Service, body: dict[str, Any]
) -> web.Response:
    """A decision or System One body: planned here, answered on the engine, rendered; the
    access log counts its prompt tokens."""
    planned = service.plan(body, request.app[SETTINGS], engine.sha256)
    answered = await run_job(request, engine, functools.partial(service.answer, engine, planned))
    request[TOKENS] = answered.input_tokens
    return web.json_response(answered.body)
