"""POST /v1/systemone, POST /v1/systemone/batch and GET /v1/models: the TypeSafe System One API
on our engine."""

from __future__ import annotations

import functools

from aiohttp import web

from semif_proxy.api import systemone_batch, systemone_schemas
from semif_proxy.api.services import SERVICES
from semif_proxy.http import engine_job
from semif_proxy.http.bodies import read_json_object
from semif_proxy.http.keys import SETTINGS
from semif_proxy.http.middleware import REQUEST_ID, TOKENS
from semif_proxy.http.routes import proxy

# The TypeSafe SDK reads a response's request id (`result.request_id`, and its errors') here.
TYPESAFE_REQUEST_ID = "x-typesafe-request-id"
# Marks a request answered by the System One API on another route (POST /invocations).
SYSTEM_ONE = web.RequestKey("system_one", bool)
ROUTES = frozenset({"/v1/systemone", "/v1/systemone/batch", "/v1/models"})


async def systemone_route(request: web.Request) -> web.Response:
    request[SYSTEM_ONE] = True
    async with engine_job.admitted(request) as call:
        body, _ = await read_json_object(request, request.app[SETTINGS].max_body_bytes)
        return await call.answer(SERVICES["systemone"], body)


async def batch_route(request: web.Request) -> web.Response:
    """Each state is its own engine job, so single requests queued meanwhile are not held up
    behind the whole batch, and the deadline is checked between states as well as within."""
    settings = request.app[SETTINGS]
    async with engine_job.admitted(request) as call:
        body, _ = await read_json_object(request, settings.max_body_bytes)
        engine = call.engine
        batch = systemone_batch.plan_batch(body, settings, engine.sha256)
        await call.run(functools.partial(systemone_batch.check_batch, engine, batch))
        evaluated = [
            await call.run(functools.partial(systemone_batch.evaluate_state, engine, batch, i))
            for i in range(len(batch.states))
        ]
        # After every state: a batch correction divides out the whole batch's mean answer.
        responses = await call.run(
            functools.partial(systemone_batch.render_states, engine, evaluated, settings.strict)
        )
    response = systemone_batch.combine_batch(responses, settings.strict)
    response["request_id"] = request[REQUEST_ID]
    request[TOKENS] = response["usage"]["input_tokens"]
    return web.json_response(response)


async def models_route(request: web.Request) -> web.StreamResponse:
    if not request.app[SETTINGS].decisions:
        return await proxy.passthrough(request)  # chat-only: llama-server's own list
    engine = engine_job.require_engine(request)
    listing = systemone_schemas.models_listing(request.app[SETTINGS].model_path, engine.sha256)
    return web.json_response(listing)


async def tag_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: every System One answer carries its X-Request-Id as
    x-typesafe-request-id too, errors included; a signal reaches the 401s of the auth
    middleware and the errors the request middleware renders, which the handlers never see."""
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else None
    request_id = request.get(REQUEST_ID)
    if request_id and (route in ROUTES or request.get(SYSTEM_ONE)):
        response.headers[TYPESAFE_REQUEST_ID] = request_id
