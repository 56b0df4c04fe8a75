"""POST /v1/systemone and GET /v1/models: the TypeSafe System One API on our engine."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from semif_proxy import rotations, systemone
from semif_proxy.bodies import read_json_object
from semif_proxy.engine import Question, Rotated
from semif_proxy.errors import InvalidRequest
from semif_proxy.keys import DECISION_ADMISSION, SETTINGS
from semif_proxy.middleware import remaining
from semif_proxy.routes import proxy
from semif_proxy.routes.decisions import check_count, require_engine, run_on_engine


def _loc(field: str) -> list[str | int]:
    return [p for p in field.replace("[", ".").replace("]", "").split(".") if p]


async def answer(request: web.Request, body: dict[str, Any]) -> web.Response:
    engine = require_engine(request)
    settings = request.app[SETTINGS]
    parsed = systemone.parse_request(body)
    served = systemone.served_model_id(settings.model_path, engine.sha256)
    if parsed.model not in (served, *systemone.ALIASES):
        raise systemone.schema_error(
            ["model"], f"unknown model {parsed.model!r}; available: {[served, *systemone.ALIASES]}"
        )
    check_count(len(parsed.questions), "questions", settings.max_decisions)
    specs = [systemone.build_spec(qid, q) for qid, q in parsed.questions.items()]
    k = parsed.permutations or settings.permutations
    asked = [
        Rotated.of(
            Question(
                path=f"questions.{spec.qid}",
                id=spec.qid,
                state=parsed.state,
                question=spec.instructions,
                descriptions=spec.descriptions,
                temperature=settings.temperature.for_type(spec.kind),
            ),
            k,
        )
        for spec in specs
    ]
    try:
        runs, evaluation = await run_on_engine(request, lambda: engine.evaluate_rotated(asked))
    except InvalidRequest as exc:
        raise systemone.schema_error(_loc(exc.field or "body"), exc.message) from None

    answers: dict[str, Any] = {}
    diagnostics: dict[str, Any] = {}
    for spec, rotated, scored in zip(specs, asked, runs):
        orders = rotated.orders
        probs, moved = rotations.combine([(o, s.probabilities) for o, s in zip(orders, scored)])
        answers[spec.qid] = systemone.answer_for(spec, probs, parsed.min_confidence)
        diagnostics[spec.qid] = {
            "option_logits": [[float(v) for v in s.option_logits] for s in scored],
            "allowed_token_mass": [s.allowed_token_mass for s in scored],
            "prompt_sha256": [engine.prompt_sha256(s.prompt) for s in scored],
            "rotations": orders,
            "argmax_moved": moved,
        }
    request["tokens"] = evaluation.evaluated_tokens
    response: dict[str, Any] = {
        "model": served,
        "answers": answers,
        "usage": {"input_tokens": evaluation.evaluated_tokens, "output_tokens": 0},
    }
    if not settings.strict:
        response["semif"] = {
            "questions": diagnostics,
            "timing": evaluation.timing,
            "prompt_version": engine.prompt_version,
            "model": engine.model_info,
        }
    return web.json_response(response)


async def systemone_route(request: web.Request) -> web.Response:
    require_engine(request)
    async with request.app[DECISION_ADMISSION].slot(remaining(request)):
        body, _ = await read_json_object(request, request.app[SETTINGS].max_body_bytes)
        return await answer(request, body)


async def models_route(request: web.Request) -> web.StreamResponse:
    if not request.app[SETTINGS].decisions:
        return await proxy.passthrough(request)  # chat-only: llama-server's own list
    engine = require_engine(request)
    listing = systemone.models_listing(request.app[SETTINGS].model_path, engine.sha256)
    # OpenAI clients read "data"; System One clients read "models".
    listing["object"] = "list"
    listing["data"] = [
        {"id": m["name"], "object": "model", "owned_by": "semif-proxy"} for m in listing["models"]
    ]
    return web.json_response(listing)
