"""The System One API (TypeSafe's noul / choice / score contract) mapped onto the decision
engine: its request model, each question as a lettered decision (in the option orders the
request asks for), and the engine's scored rows combined into answers and diagnostics.

A batch (`plan_batch`) asks the same questions of up to SEMIF_MAX_BATCH_STATES states: one
plan per state, each answered as a single request would be, after one check of the whole batch
before any work. No HTTP here: the route parses the body, runs `answer` on the engine thread and
renders it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from semif_proxy import readout
from semif_proxy.api import rotations, rows_log
from semif_proxy.api.rotations import Rotated
from semif_proxy.api.schemas import check_count
from semif_proxy.calibration.abstention import ThresholdError, Thresholds
from semif_proxy.engine.prompt import MAX_OPTIONS, NUMBER_LABELS, labels_for, prompt_sha256
from semif_proxy.engine.questions import Question, Scored
from semif_proxy.engine.worker import DecisionEngine
from semif_proxy.errors import InvalidRequest, PayloadTooLarge, SchemaError, Unavailable
from semif_proxy.settings import Settings

Content = str | dict[str, Any] | list[Any]
# Names Jev clients send by default; each one means the model served here.
ALIASES = ("jev-latest", "jev-preview")
# Clients pinned to a release send jev-1.<n> (jev-1.0, jev-1.2, ...): accepted, one listed.
VERSIONED = re.compile(r"jev-1\.[0-9]+")
LISTED_VERSION = "jev-1.0"
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
    # One option is answered without the model (probability 1); Jev allows 1..255.
    criteria: dict[str, Content | None] = Field(min_length=1, max_length=MAX_OPTIONS)


class ScoreQuestion(_Strict):
    type: Literal["score"]
    instructions: Content | None = None
    criteria: list[Content] = Field(min_length=2, max_length=MAX_OPTIONS)


QuestionModel = Annotated[
    NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")
]


class _RequestBase(_Strict):
    """What a System One request and a batch share: everything but the state(s)."""

    model: str
    questions: dict[str, QuestionModel] = Field(min_length=1)
    permutations: int | None = Field(None, ge=1, le=MAX_OPTIONS)
    # false: no fitted position prior (SEMIF_CALIBRATION) is applied to this request.
    position_prior: bool = True
    # A number or a map by question type and option count, checked by `thresholds` (a 422 at
    # its path in the value); None: SEMIF_MIN_CONFIDENCE.
    min_confidence: Any = None


class SystemOneRequest(_RequestBase):
    state: Content


class SystemOneBatchRequest(_RequestBase):
    """POST /v1/systemone/batch: a System One request with `states` in place of `state`."""

    states: list[Content] = Field(min_length=1)


Parsed = SystemOneRequest | SystemOneBatchRequest
P = TypeVar("P", SystemOneRequest, SystemOneBatchRequest)


MAX_ERRORS = 20


def _validate(model: type[P], body: Any) -> P:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        # The first errors are what a client fixes; thousands of them are only bytes.
        detail = [
            {"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False)[:MAX_ERRORS]
        ]
        raise SchemaError(detail) from None


def parse_request(body: Any) -> SystemOneRequest:
    return _validate(SystemOneRequest, body)


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


def build_spec(
    qid: str, q: NoulQuestion | ChoiceQuestion | ScoreQuestion, labels: str = "auto"
) -> Spec:
    """A question as the engine asks it. `labels`: SEMIF_LABELS, which decides whether the
    options will be lettered or numbered."""
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
    if labels_for(len(q.criteria), labels) is NUMBER_LABELS:
        # Numbered from 1, in level order: the label is the level's place, and a "level 0"
        # beside the label "1" would give the model two numbers for one option.
        descs = tuple(_text(c) for c in q.criteria)
    else:
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
        # `abstained` for the clients that read it before `abstention` and `threshold`.
        answer["abstained"] = conf < min_confidence
        answer["abstention"] = "abstained" if answer["abstained"] else "passed"
        answer["threshold"] = min_confidence
    return answer


def prompt_versions(scored: Iterable[Scored]) -> str:
    """The prompt versions a response used (letters, numbers), one string for the block."""
    return ", ".join(sorted({s.prompt_version for s in scored if s.prompt_version})) or "none"


def served_model_id(model_path: Path, sha256: str) -> str:
    return f"{model_path.stem.lower()}@{sha256[:12]}"


def accepts_model(name: str, served: str) -> bool:
    """The served id, an alias, or a versioned jev-1.<n> id: all name the one model here."""
    return name == served or name in ALIASES or VERSIONED.fullmatch(name) is not None


def models_listing(model_path: Path, sha256: str) -> dict[str, Any]:
    """GET /v1/models: the served id and its aliases, for System One and OpenAI clients."""
    released = (
        datetime.fromtimestamp(model_path.stat().st_mtime, tz=timezone.utc).date().isoformat()
    )
    served = served_model_id(model_path, sha256)
    descriptions = {
        served: f"{model_path.name} (sha256 {sha256[:12]}) served by semif-proxy",
        **{alias: f"alias of {served}" for alias in ALIASES},
        LISTED_VERSION: f"alias of {served}; every jev-1.<n> (jev-1.0, jev-1.2, ...) is accepted",
    }
    names = list(descriptions)
    return {
        "models": [
            {"name": n, "description": descriptions[n], "release_date": released} for n in names
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

    request: Parsed
    served: str
    specs: list[Spec]
    asked: list[Rotated]
    # The request's min_confidence, else SEMIF_MIN_CONFIDENCE; None: answers are not judged.
    thresholds: Thresholds | None = None


def _loc(field: str) -> list[str | int]:
    return [p for p in field.replace("[", ".").replace("]", "").split(".") if p]


def check_questions(body: Any, settings: Settings) -> None:
    """The question and option counts, before validation: validating (and reporting) a huge
    `questions` object is seconds of work on the event loop."""
    questions = body.get("questions") if isinstance(body, dict) else None
    if isinstance(questions, dict):
        check_count(len(questions), "questions", settings.max_questions, "SEMIF_MAX_QUESTIONS")
        for qid, question in questions.items():
            listed = isinstance(question, dict) and question.get("type") in ("choice", "score")
            criteria = question.get("criteria") if listed else None
            if isinstance(criteria, (dict, list)):
                check_count(
                    len(criteria),
                    f"questions.{qid}.criteria",
                    settings.max_options,
                    "SEMIF_MAX_OPTIONS",
                )


def _checked(parsed: Parsed, settings: Settings, sha256: str) -> tuple[str, list[Spec]]:
    """The served id (the model named must be one of ours) and the questions as specs."""
    served = served_model_id(settings.model_path, sha256)
    if not accepts_model(parsed.model, served):
        available = [served, *ALIASES, "jev-1.<n>"]
        raise schema_error(["model"], f"unknown model {parsed.model!r}; available: {available}")
    return served, [build_spec(qid, q, settings.labels) for qid, q in parsed.questions.items()]


def thresholds(parsed: Parsed, settings: Settings) -> Thresholds | None:
    """The request's min_confidence (a 422 at its path in the value when bad: e.g.
    body.min_confidence.choice.3-4), else the server's SEMIF_MIN_CONFIDENCE."""
    if parsed.min_confidence is None:
        return settings.min_confidence
    try:
        return Thresholds.parse(parsed.min_confidence)
    except ThresholdError as exc:
        raise schema_error(["min_confidence", *exc.path], exc.message) from None


def _threshold(planned: Plan, spec: Spec, strict: bool) -> float | None:
    """The threshold this answer is judged by. Strict answers keep TypeSafe's fields: the
    server's setting alone adds none there, a request that sends min_confidence asks for them."""
    if planned.thresholds is None or (strict and planned.request.min_confidence is None):
        return None
    return planned.thresholds.threshold_for(spec.kind, len(spec.option_ids))


def _ask(
    state: Content, specs: list[Spec], k: int, settings: Settings, prior: bool = True
) -> list[Rotated]:
    return [
        Rotated.of(
            Question(
                path=f"questions.{spec.qid}",
                id=spec.qid,
                state=state,
                question=spec.instructions,
                descriptions=spec.descriptions,
                temperature=settings.temperature.for_type(spec.kind),
                log_position_prior=(
                    settings.position_prior.log_prior(spec.kind, len(spec.descriptions))
                    if prior
                    else None
                ),
            ),
            k,
        )
        for spec in specs
    ]


def plan(body: Any, settings: Settings, sha256: str) -> Plan:
    """Validate a request (422 in FastAPI's shape; 413 for too many questions) and build its
    engine questions. Runs before the request queues for the engine."""
    check_questions(body, settings)
    parsed = parse_request(body)
    served, specs = _checked(parsed, settings, sha256)
    k = parsed.permutations or settings.permutations
    return Plan(
        parsed,
        served,
        specs,
        _ask(parsed.state, specs, k, settings, parsed.position_prior),
        thresholds(parsed, settings),
    )


def answer(engine: DecisionEngine, planned: Plan, strict: bool) -> dict[str, Any]:
    """Every question on the one prefix, combined over its rotations into its answer; the
    `semif` diagnostics block unless strict. Runs on the engine thread."""
    try:
        evaluation = engine.evaluate_checked(rotations.flatten(planned.asked))
    except InvalidRequest as exc:
        raise schema_error(_loc(exc.field or "body"), exc.message) from None
    runs = rotations.regroup(planned.asked, evaluation.scored)
    rows_log.record(
        engine.settings.rows_log,
        (
            rows_log.question_line(
                engine.model_info, "systemone", spec.kind, spec.qid, spec.option_ids, r.orders, s
            )
            for spec, r, s in zip(planned.specs, planned.asked, runs)
            if len(spec.option_ids) > 1  # one option: no model call, nothing to learn from
        ),
    )
    answers: dict[str, Any] = {}
    diagnostics: dict[str, Any] = {}
    for spec, rotated, scored in zip(planned.specs, planned.asked, runs):
        orders = rotated.orders
        probs, moved = rotations.combine([(o, s.probabilities) for o, s in zip(orders, scored)])
        answers[spec.qid] = answer_for(spec, probs, _threshold(planned, spec, strict))
        if not strict:
            # What the numbers are: letter logits, label sequences (over 26 options) or no
            # model call (one option). TypeSafe clients ignore extra keys; strict leaves them out.
            answers[spec.qid]["readout"] = scored[0].readout
            answers[spec.qid]["prompt_version"] = scored[0].prompt_version
        diagnostics[spec.qid] = {
            "option_logits": [[float(v) for v in s.option_logits] for s in scored],
            "allowed_token_mass": [s.allowed_token_mass for s in scored],
            "prompt_sha256": [prompt_sha256(s.prompt) for s in scored],
            "rotations": orders,
            "argmax_moved": moved,
            **(
                {"first_token_logits": [[float(v) for v in s.first_token_logits] for s in scored]}
                if scored[0].first_token_logits is not None
                else {}
            ),
            # Whether a fitted position prior (SEMIF_CALIBRATION) was divided out.
            "position_prior": scored[0].question.position_prior,
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
            "prompt_version": prompt_versions(s for r in runs for s in r),
            "model": engine.model_info,
        }
    return response


# -- batches ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchPlan:
    """The same questions asked of each state, in the request's order. A state's engine
    questions (questions x rotations, each holding the state) are built when that state is
    answered, on the engine thread: not all of them at once on the event loop."""

    request: SystemOneBatchRequest
    served: str
    specs: list[Spec]
    rotations: int
    settings: Settings
    thresholds: Thresholds | None = None  # as Plan's

    @property
    def states(self) -> list[Content]:
        return list(self.request.states)

    def plan(self, i: int) -> Plan:
        asked = _ask(
            self.request.states[i],
            self.specs,
            self.rotations,
            self.settings,
            self.request.position_prior,
        )
        return Plan(self.request, self.served, self.specs, asked, self.thresholds)


_JSON_TYPES = {bool: "a boolean", int: "a number", float: "a number", type(None): "null"}


def plan_batch(body: dict[str, Any], settings: Settings, sha256: str) -> BatchPlan:
    """Validate a batch: `states` first (400 naming `states[i]`; 413 over
    SEMIF_MAX_BATCH_STATES, before any state is read), then everything a single request has
    (422 in FastAPI's shape, 413 for too many questions, as POST /v1/systemone answers)."""
    states = body.get("states")
    if not isinstance(states, list) or not states:
        raise InvalidRequest(
            "states: a batch needs a non-empty array of states (one System One state each)",
            field="states",
        )
    check_count(len(states), "states", settings.max_batch_states, "SEMIF_MAX_BATCH_STATES")
    for i, state in enumerate(states):
        if not isinstance(state, (str, dict, list)):
            kind = _JSON_TYPES.get(type(state), type(state).__name__)
            raise InvalidRequest(
                f"states[{i}]: a state is a string, an object or an array, not {kind}",
                field=f"states[{i}]",
            )
    check_questions(body, settings)
    parsed = _validate(SystemOneBatchRequest, body)
    served, specs = _checked(parsed, settings, sha256)
    k = parsed.permutations or settings.permutations
    return BatchPlan(parsed, served, specs, k, settings, thresholds(parsed, settings))


def check_batch(engine: DecisionEngine, batch: BatchPlan) -> None:
    """Refuse a batch that cannot be answered before any of its work (no forward pass, no
    prompt but each state's own prefix): every state free of the model's special tokens and
    under the prompt limit, and the whole batch within the request's token budget
    (SEMIF_MAX_REQUEST_TOKENS): each state's own tokens plus every question's text once per
    state and rotation, less a token per text for merges at its edges (a lower bound, as a
    single request is checked). Each state is then checked exactly again when it is answered.
    Runs on the engine thread."""
    if engine.unavailable_reason:
        raise Unavailable(engine.unavailable_reason)
    questions = rotations.flatten(batch.plan(0).asked)
    asked = engine.asked_tokens(questions)
    request_limit = engine.settings.request_token_limit
    first = questions[0]
    total = 0
    for i, state in enumerate(batch.states):
        where = f"states[{i}]"
        engine.special_tokens.check(state, where)
        own = engine.state_tokens(replace(first, state=state), where)
        total += own + asked
        if total > request_limit:  # the states after this one can only add to it
            raise PayloadTooLarge(
                f"the batch needs at least {total} evaluated tokens (states[0] to {where}), "
                f"over the limit of {request_limit} (SEMIF_MAX_REQUEST_TOKENS)",
                field="body",
                tokens=total,
                limit=request_limit,
            )


def answer_state(engine: DecisionEngine, batch: BatchPlan, i: int, strict: bool) -> dict[str, Any]:
    """One state of a batch, answered exactly as a single request with that state; a limit it
    breaks names the state. Runs on the engine thread."""
    try:
        return answer(engine, batch.plan(i), strict)
    except PayloadTooLarge as exc:
        raise PayloadTooLarge(
            f"states[{i}]: {exc.message}", field=f"states[{i}]", **exc.extra
        ) from None


def combine_batch(responses: list[dict[str, Any]], strict: bool) -> dict[str, Any]:
    """The states' answers in the request's order, with their usage summed."""
    combined: dict[str, Any] = {
        "model": responses[0]["model"],
        "answers": [r["answers"] for r in responses],
        "usage": {
            "input_tokens": sum(r["usage"]["input_tokens"] for r in responses),
            "output_tokens": 0,
        },
    }
    if not strict:
        combined["semif"] = {
            "states": [
                {"questions": r["semif"]["questions"], "timing": r["semif"]["timing"]}
                for r in responses
            ],
            "prompt_version": ", ".join(
                sorted({v for r in responses for v in r["semif"]["prompt_version"].split(", ")})
            ),
            "model": responses[0]["semif"]["model"],
        }
    return combined
