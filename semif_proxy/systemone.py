"""The System One API (TypeSafe's noul / choice / score contract) mapped onto the decision
engine: its request model, each question as a lettered decision (in the option orders the
request asks for), and the engine's scored rows combined into answers and diagnostics.

No HTTP here: the route parses the body, runs `answer` on the engine thread and renders it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from semif_proxy import readout, rotations
from semif_proxy.engine import DecisionEngine, Question
from semif_proxy.errors import InvalidRequest, SchemaError
from semif_proxy.prompt import MAX_OPTIONS, PROMPT_VERSION, prompt_sha256
from semif_proxy.rotations import Rotated
from semif_proxy.schemas import check_count
from semif_proxy.settings import Settings

Content = str | dict[str, Any] | list[Any]
ALIASES = ("jev-latest", "jev-preview")
DEFAULT_INSTRUCTIONS = {
    "noul": "Decide whether the instructions hold for the evidence.",
    "choice": "Choose the option that fits the evidence best.",
    "score": "Rate the evidence on the listed levels.",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NoulCriteria(_Strict):
    true: Content | None = None
    false: Content | None = None


class NoulQuestion(_Strict):
    type: Literal["noul"]
    instructions: Content | None = None
    criteria: NoulCriteria | None = None


class ChoiceQuestion(_Strict):
    type: Literal["choice"]
    instructions: Content | None = None
    criteria: dict[str, Content | None] = Field(min_length=2, max_length=MAX_OPTIONS)


class ScoreQuestion(_Strict):
    type: Literal["score"]
    instructions: Content | None = None
    criteria: list[Content] = Field(min_length=2, max_length=MAX_OPTIONS)


QuestionModel = Annotated[
    NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")
]


class SystemOneRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str
    state: Content
    questions: dict[str, QuestionModel] = Field(min_length=1)
    permutations: int | None = Field(None, ge=1, le=MAX_OPTIONS)
    min_confidence: float | None = Field(None, ge=0.0, le=1.0)


def parse_request(body: Any) -> SystemOneRequest:
    try:
        return SystemOneRequest.model_validate(body)
    except ValidationError as exc:
        detail = [
            {"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False)
        ]
        raise SchemaError(detail) from None


def schema_error(loc: list[str | int], msg: str, kind: str = "value_error") -> SchemaError:
    return SchemaError([{"loc": ["body", *loc], "msg": msg, "type": kind}])


def _text(value: Content | None) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Spec:
    """One System One question as a lettered decision: option ids and what the model reads."""

    qid: str
    kind: str
    instructions: str
    option_ids: tuple[str, ...]
    descriptions: tuple[str, ...]
    legend: dict[str, Content] | None = None


def build_spec(qid: str, q: NoulQuestion | ChoiceQuestion | ScoreQuestion) -> Spec:
    instructions = _text(q.instructions) or DEFAULT_INSTRUCTIONS[q.type]
    if isinstance(q, NoulQuestion):
        crit = q.criteria or NoulCriteria()
        yes = _text(crit.true) or "the instructions hold for the evidence"
        no = _text(crit.false) or "the instructions do not hold for the evidence"
        return Spec(qid, "noul", instructions, ("true", "false"), (f"yes: {yes}", f"no: {no}"))
    if isinstance(q, ChoiceQuestion):
        names = tuple(q.criteria)
        descs = tuple(f"{n}: {_text(d)}" if _text(d) else n for n, d in q.criteria.items())
        return Spec(qid, "choice", instructions, names, descs)
    ids = tuple(str(i) for i in range(len(q.criteria)))
    descs = tuple(f"level {i}: {_text(c)}" for i, c in enumerate(q.criteria))
    return Spec(qid, "score", instructions, ids, descs, legend=dict(zip(ids, q.criteria)))


def answer_for(spec: Spec, probs: np.ndarray, min_confidence: float | None) -> dict[str, Any]:
    conf = readout.confidence(probs)
    if spec.kind == "noul":
        answer: dict[str, Any] = {"type": "noul", "noul": float(probs[0])}
    elif spec.kind == "choice":
        answer = {
            "type": "choice",
            "choice": spec.option_ids[int(np.argmax(probs))],
            "probabilities": {i: float(p) for i, p in zip(spec.option_ids, probs)},
            "confidence": conf,
        }
    else:
        answer = {
            "type": "score",
            "score": float(sum(i * p for i, p in enumerate(probs))),
            "legend": spec.legend,
            "probabilities": {i: float(p) for i, p in zip(spec.option_ids, probs)},
            "confidence": conf,
        }
    if min_confidence is not None:
        answer["abstained"] = conf < min_confidence
    return answer


def served_model_id(model_path: Path, sha256: str) -> str:
    return f"{model_path.stem.lower()}@{sha256[:12]}"


def models_listing(model_path: Path, sha256: str) -> dict[str, Any]:
    """GET /v1/models: the served id and its aliases, for System One and OpenAI clients."""
    released = (
        datetime.fromtimestamp(model_path.stat().st_mtime, tz=timezone.utc).date().isoformat()
    )
    served = served_model_id(model_path, sha256)
    description = f"{model_path.name} (sha256 {sha256[:12]}) served by semif-proxy"
    names = [served, *ALIASES]
    return {
        "models": [
            {
                "name": n,
                "description": description if n == served else f"alias of {served}",
                "release_date": released,
            }
            for n in names
        ],
        # OpenAI clients read "data"; System One clients read "models".
        "object": "list",
        "data": [{"id": n, "object": "model", "owned_by": "semif-proxy"} for n in names],
    }


# -- the service ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """A validated System One request, its questions as lettered decisions, each in the option
    orders it is asked in."""

    request: SystemOneRequest
    served: str
    specs: list[Spec]
    asked: list[Rotated]


def _loc(field: str) -> list[str | int]:
    return [p for p in field.replace("[", ".").replace("]", "").split(".") if p]


def plan(body: Any, settings: Settings, sha256: str) -> Plan:
    """Validate a request (422 in FastAPI's shape; 413 for too many questions) and build its
    engine questions. Runs before the request queues for the engine."""
    parsed = parse_request(body)
    served = served_model_id(settings.model_path, sha256)
    if parsed.model not in (served, *ALIASES):
        raise schema_error(
            ["model"], f"unknown model {parsed.model!r}; available: {[served, *ALIASES]}"
        )
    check_count(len(parsed.questions), "questions", settings.max_decisions)
    specs = [build_spec(qid, q) for qid, q in parsed.questions.items()]
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
    return Plan(parsed, served, specs, asked)


def answer(engine: DecisionEngine, planned: Plan, strict: bool) -> dict[str, Any]:
    """Every question on the one prefix, combined over its rotations into its answer; the
    `semif` diagnostics block unless strict. Runs on the engine thread."""
    try:
        evaluation = engine.evaluate_checked(rotations.flatten(planned.asked))
    except InvalidRequest as exc:
        raise schema_error(_loc(exc.field or "body"), exc.message) from None
    runs = rotations.regroup(planned.asked, evaluation.scored)
    answers: dict[str, Any] = {}
    diagnostics: dict[str, Any] = {}
    for spec, rotated, scored in zip(planned.specs, planned.asked, runs):
        orders = rotated.orders
        probs, moved = rotations.combine([(o, s.probabilities) for o, s in zip(orders, scored)])
        answers[spec.qid] = answer_for(spec, probs, planned.request.min_confidence)
        diagnostics[spec.qid] = {
            "option_logits": [[float(v) for v in s.option_logits] for s in scored],
            "allowed_token_mass": [s.allowed_token_mass for s in scored],
            "prompt_sha256": [prompt_sha256(s.prompt) for s in scored],
            "rotations": orders,
            "argmax_moved": moved,
        }
    response: dict[str, Any] = {
        "model": planned.served,
        "answers": answers,
        "usage": {"input_tokens": evaluation.evaluated_tokens, "output_tokens": 0},
    }
    if not strict:
        response["semif"] = {
            "questions": diagnostics,
            "timing": evaluation.timing,
            "prompt_version": PROMPT_VERSION,
            "model": engine.model_info,
        }
    return response
