"""How a route runs work on the decision engine, the same way on every route: the engine
required once, the decision admission slot taken before the body is read, every job run within
what is left of the request's deadline under the CPU policy's engine turn, with one hop onto the
engine thread; and a service's answer rendered."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from semif_proxy.errors import NotFound, Unavailable
from semif_proxy.http.deadline import DEADLINE, deadline_passed, remaining
from semif_proxy.http.keys import CPU_POLICY, DECISION_ADMISSION, ENGINE, SETTINGS
from semif_proxy.http.middleware import TOKENS

if TYPE_CHECKING:
    from semif_proxy.api.services import Service
    from semif_proxy.engine.worker import DecisionEngine

T = TypeVar("T")


def require_engine(request: web.Request) -> DecisionEngine:
    """The loaded engine; 404 where decisions are off, 503 while it loads. An engine that
    refuses decisions for this model (its self-check failed; /ping says 503 meanwhile) answers
    a 503 naming why from its first job."""
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
    left = request[DEADLINE] - asyncio.get_running_loop().time()
    if left <= 0:
        raise deadline_passed(request)
    async with request.app[CPU_POLICY].engine_turn(left):
        left = request[DEADLINE] - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(engine.run(fn), max(left, 0.001))
        except asyncio.TimeoutError:
            raise deadline_passed(request) from None


@dataclass(frozen=True)
class EngineCall:
    """An admitted request's way onto the engine: what `admitted` yields to a route."""

    request: web.Request
    engine: DecisionEngine

    async def run(self, fn: Callable[[], T]) -> T:
        """fn on the engine thread (run_job)."""
        return await run_job(self.request, self.engine, fn)

    async def off_loop(self, fn: Callable[[], T]) -> T:
        """fn on a worker thread (not the engine's) within the request's deadline: validating
        a body limit's worth of lines takes seconds, which the event loop must not wait for."""
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(None, fn), remaining(self.request))
        except asyncio.TimeoutError:
            raise deadline_passed(self.request) from None

    async def answer(self, service: Service, body: dict[str, Any]) -> web.Response:
        """A decision or System One body: planned here, answered on the engine, rendered; the
        access log counts its prompt tokens."""
        settings = self.request.app[SETTINGS]
        planned = service.plan(body, settings, self.engine.sha256)
        answered = await self.run(lambda: service.answer(self.engine, planned))
        self.request[TOKENS] = answered.input_tokens
        return web.json_response(answered.body)


@contextlib.asynccontextmanager
async def admitted(request: web.Request) -> AsyncIterator[EngineCall]:
    """The engine required, then a place in the decision queue within the request's deadline:
    a route reads its body only once it holds one."""
    engine = require_engine(request)
    async with request.app[DECISION_ADMISSION].slot(remaining(request)):
        yield EngineCall(request, engine)
