"""A request's deadline: the monotonic instant (loop.time()) by which its own work must end,
queueing included. The request middleware sets it on arrival from SEMIF_REQUEST_TIMEOUT; every
wait after that (an admission queue, the engine, llama-server) gets what is left of it."""

from __future__ import annotations

import asyncio

from aiohttp import web

from semif_proxy.errors import Timeout
from semif_proxy.http.keys import SETTINGS

DEADLINE = web.RequestKey("deadline", float)


def start(request: web.Request) -> None:
    request[DEADLINE] = asyncio.get_running_loop().time() + request.app[SETTINGS].request_timeout


def remaining(request: web.Request) -> float:
    """Seconds left before the request's deadline (never below a millisecond)."""
    return max(0.001, request[DEADLINE] - asyncio.get_running_loop().time())


def deadline_passed(request: web.Request) -> Timeout:
    """The 504 of a request whose deadline passed; its work has been stopped."""
    timeout = request.app[SETTINGS].request_timeout
    return Timeout(
        f"the request took longer than {timeout:g}s and its work was stopped "
        "(SEMIF_REQUEST_TIMEOUT; SageMaker cuts real-time invocations at 60 s)",
        limit=timeout,
    )
