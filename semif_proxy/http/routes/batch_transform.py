"""SageMaker Batch Transform on /invocations: a JSON Lines body answered line for line, and GET
/execution-parameters (the payload and concurrency limits Batch Transform reads)."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from semif_proxy.http import engine_job, jsonlines
from semif_proxy.http.bodies import read_limited
from semif_proxy.http.keys import SETTINGS
from semif_proxy.http.middleware import REQUEST_ID, TOKENS
from semif_proxy.settings import Settings

log = logging.getLogger("semif_proxy.access")
MIB = 1 << 20
MAX_PAYLOAD_MB = 100  # SageMaker's largest MaxPayloadInMB


async def answer_lines(request: web.Request) -> web.Response:
    """A JSON Lines body, read once the call holds a place in the decision queue and answered
    within the request's deadline (http/jsonlines.py says how, and what fails the whole
    call)."""
    settings = request.app[SETTINGS]
    async with engine_job.admitted(request) as call:
        raw = await read_limited(request, settings.max_body_bytes)
        answered = await jsonlines.answer_body(raw, settings, call, request[REQUEST_ID])
    request[TOKENS] = answered.tokens
    # The access line (middleware) is the same for every route; this one says what the call held.
    log.info(
        "json lines",
        extra={
            "event": "json_lines",
            "request_id": request[REQUEST_ID],
            "lines": answered.lines,
            "line_errors": answered.errors,
            "states": answered.states,
        },
    )
    return web.Response(body=answered.body, content_type=jsonlines.CONTENT_TYPE)


def execution_parameters(settings: Settings) -> dict[str, Any]:
    """GET /execution-parameters: what a Batch Transform job that leaves them unset uses.

    One line per call (SingleRecord): a line takes up to about half a second, so a call of
    MultiRecord's thousands of lines would outrun the request deadline, and SageMaker would
    write what the deadline did not reach as a failed call. Lines of one state still share its
    prefill across calls through the engine's prefix cache. One call at a time: the engine
    evaluates one job at a time, so a second concurrent call would only wait, its deadline
    running. The payload is the body limit in whole MiB (SageMaker counts whole MB; 1 MiB is at
    least 1 MB however it counts them), at least 1 (0 means streaming to SageMaker) and at most
    SageMaker's 100."""
    return {
        "MaxConcurrentTransforms": 1,
        "BatchStrategy": "SingleRecord",
        "MaxPayloadInMB": min(MAX_PAYLOAD_MB, max(1, settings.max_body_bytes // MIB)),
    }


async def execution_parameters_route(request: web.Request) -> web.Response:
    return web.json_response(execution_parameters(request.app[SETTINGS]))
