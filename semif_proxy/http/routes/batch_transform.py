"""SageMaker Batch Transform on /invocations: a JSON Lines body answered line for line, and GET
/execution-parameters (the payload and concurrency limits Batch Transform reads)."""

from __future__ import annotations

import asyncio
import functools
import logging

from aiohttp import web

from semif_proxy.errors import InvalidRequest, Timeout, Unavailable
from semif_proxy.http import engine_job, jsonlines
from semif_proxy.http.bodies import read_limited
from semif_proxy.http.keys import DECISION_ADMISSION, SETTINGS
from semif_proxy.http.middleware import REQUEST_ID, TOKENS, deadline_passed, remaining
from semif_proxy.settings import JSON_LINES_PER_JOB

log = logging.getLogger("semif_proxy.access")
# Lines per engine job (settings/defaults.py says why); the engine keeps the state's prefix
# across jobs unless another request's job replaced it.
LINES_PER_JOB = JSON_LINES_PER_JOB


async def answer_lines(request: web.Request) -> web.Response:
    """A JSON Lines body: within one admission slot and the request's deadline, every line
    validated on its own (on a worker thread), the valid ones run on the engine grouped by
    state; one answer line per line, in order. A line that is bad input gets its error on its
    line; a line the deadline did not reach fails the whole call (504), as does an engine that
    fails (503), so that SageMaker retries the call rather than keep error lines."""
    settings = request.app[SETTINGS]
    engine = engine_job.require_engine(request)
    if engine.unavailable_reason:
        raise Unavailable(engine.unavailable_reason)
    async with request.app[DECISION_ADMISSION].slot(remaining(request)):
        raw = await read_limited(request, settings.max_body_bytes)
        texts = jsonlines.split_lines(raw)
        if not texts:
            raise InvalidRequest("the JSON Lines body has no lines", field="body")
        jsonlines.check_line_count(len(texts), settings.max_batch_lines)
        plan = functools.partial(jsonlines.plan_lines, texts, settings, engine.sha256)
        try:
            lines = await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(None, plan), remaining(request)
            )
        except asyncio.TimeoutError:
            raise deadline_passed(request) from None
        groups = jsonlines.groups(lines)
        progress = jsonlines.Progress(request[REQUEST_ID])
        try:
            for group in groups:
                for start in range(0, len(group), LINES_PER_JOB):
                    part = group[start : start + LINES_PER_JOB]
                    job = functools.partial(jsonlines.run_lines, engine, part, progress)
                    await engine_job.run_job(request, engine, job)
        except Timeout:
            progress.close()  # from here on the engine thread's late answers are dropped
            count = jsonlines.unfinished(lines)
            raise jsonlines.not_reached(count, len(lines), settings.request_timeout) from None
        finally:
            progress.close()
    request[TOKENS] = sum(line.tokens for line in lines)
    errors = sum(1 for line in lines if line.error is not None)
    # The access line (middleware) is the same for every route; this one says what the call held.
    log.info(
        "json lines",
        extra={
            "event": "json_lines",
            "request_id": request[REQUEST_ID],
            "lines": len(lines),
            "line_errors": errors,
            "states": len(groups),
        },
    )
    return web.Response(
        body=jsonlines.render(lines, request[REQUEST_ID]), content_type=jsonlines.CONTENT_TYPE
    )


async def execution_parameters(request: web.Request) -> web.Response:
    return web.json_response(jsonlines.execution_parameters(request.app[SETTINGS]))
