"""POST /invocations (SageMaker): one endpoint, routed by the body: JSON Lines (Batch
Transform) to routes/batch_transform.py, a JSON object to its service (decisions or System One,
api/services.py) or, where no service claims it, to llama-server's chat completions."""

from __future__ import annotations

from aiohttp import web

from semif_proxy.api import services
from semif_proxy.http import engine_job, jsonlines
from semif_proxy.http.bodies import read_json_object
from semif_proxy.http.keys import CHAT_ADMISSION, DECISION_ADMISSION, SETTINGS
from semif_proxy.http.routes import batch_transform, proxy, systemone


async def invocations(request: web.Request) -> web.StreamResponse:
    """The body's shape picks the queue, so a JSON body is read before its admission slot; a
    server whose queues are both full refuses it before reading it."""
    if request.content_type in jsonlines.MEDIA_TYPES:
        return await batch_transform.answer_lines(request)
    decision_queue, chat_queue = request.app[DECISION_ADMISSION], request.app[CHAT_ADMISSION]
    if decision_queue.full and chat_queue.full:
        decision_queue.refuse()
    body, raw = await read_json_object(request, request.app[SETTINGS].max_body_bytes)
    service = services.find(body)  # None: chat
    if service is None:
        return await proxy.chat(request, raw)
    if service.name == "systemone":
        request[systemone.SYSTEM_ONE] = True
    async with engine_job.admitted(request) as call:
        return await call.answer(service, body)
