"""POST /v1/systemone/batch: the same questions asked of up to SEMIF_MAX_BATCH_STATES states,
one plan per state, each answered as a single request would be, after one check of the whole
batch before any work."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from semif_proxy.api import rotations
from semif_proxy.api.schemas import check_count
from semif_proxy.api.systemone import (
    Plan,
    Spec,
    ask,
    check_questions,
    checked,
    evaluate,
    render,
    thresholds,
)
from semif_proxy.api.systemone_schemas import Content, SystemOneBatchRequest, schema_error, validate
from semif_proxy.calibration.abstention import Thresholds
from semif_proxy.engine import batch_bias
from semif_proxy.engine.questions import Evaluation
from semif_proxy.engine.worker import DecisionEngine
from semif_proxy.errors import InvalidRequest, PayloadTooLarge, Unavailable
from semif_proxy.settings import Settings


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
        asked = ask(
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
    parsed = validate(SystemOneBatchRequest, body)
    served, specs = checked(parsed, settings, sha256)
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
    calibrated = [q for q in questions if batch_bias.asks(q)]
    different = {batch_bias.state_key(state) for state in batch.states}
    if calibrated and len(different) < batch_bias.MIN_BATCH:  # every question asks every state
        q = calibrated[0]
        message = batch_bias.why_alone(q, "states of this batch", "; send different states")
        raise schema_error(["questions", q.id, "bias_correction"], message)
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


def evaluate_state(engine: DecisionEngine, batch: BatchPlan, i: int) -> tuple[Plan, Evaluation]:
    """One state of a batch, evaluated exactly as a single request with that state; a limit it
    breaks names the state. Runs on the engine thread."""
    planned = batch.plan(i)
    try:
        return planned, evaluate(engine, planned)
    except PayloadTooLarge as exc:
        raise PayloadTooLarge(
            f"states[{i}]: {exc.message}", field=f"states[{i}]", **exc.extra
        ) from None


def render_states(
    engine: DecisionEngine, evaluated: list[tuple[Plan, Evaluation]], strict: bool
) -> list[dict[str, Any]]:
    """Each state's response, as a single request with that state is answered, after a batch
    correction over the whole batch's states (for the questions that ask for it)."""
    scored = batch_bias.corrected_across([e.scored for _, e in evaluated])
    return [
        render(engine, planned, replace(e, scored=rows), strict)
        for (planned, e), rows in zip(evaluated, scored)
    ]


def combine_batch(responses: list[dict[str, Any]], strict: bool) -> dict[str, Any]:
    """The states' answers in the request's order, with their usage summed."""
    combined: dict[str, Any] = {
        "model": responses[0]["model"],
        "answers": [r["answers"] for r in responses],
        "usage": {
            "input_tokens": sum(r["usage"]["input_tokens"] for r in responses),
            "output_tokens": sum(r["usage"]["output_tokens"] for r in responses),
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
