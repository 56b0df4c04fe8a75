"""The System One API (TypeSafe's noul / choice / score contract) mapped onto the decision
engine: each question of a validated request (systemone_schemas.py) as a lettered decision (in
the option orders the request asks for), and the engine's scored rows combined into answers and
diagnostics. Batches: systemone_batch.py. No HTTP here: the service registry (services.py)
plans a body, runs `answer` on the engine thread and returns it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from semif_proxy import readout
from semif_proxy.api import rotations, rows_log
from semif_proxy.api.readout_fields import (
    deliberation_budget,
    reported,
    rotated,
)
from semif_proxy.api.rotations import Rotated
from semif_proxy.api.schemas import check_count
from semif_proxy.api.systemone_schemas import (
    ALIASES,
    Content,
    Parsed,
    accepts_model,
    parse_request,
    schema_error,
    served_model_id,
)
from semif_proxy.api.systemone_specs import Spec, build_spec
from semif_proxy.calibration.abstention import ThresholdError, Thresholds
from semif_proxy.engine import batch_bias
from semif_proxy.engine.prompt import prompt_sha256
from semif_proxy.engine.questions import Evaluation, Question, Scored
from semif_proxy.engine.worker import DecisionEngine
from semif_proxy.errors import InvalidRequest
from semif_proxy.settings import Settings


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


def field_loc(field: str) -> list[str | int]:
    """A field path ("questions.q1.bias_correction") as a FastAPI error `loc`."""
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


def checked(parsed: Parsed, settings: Settings, sha256: str) -> tuple[str, list[Spec]]:
    """The served id (the model named must be one of ours) and the questions as specs."""
    served = served_model_id(settings.model_path, sha256)
    if not accepts_model(parsed.model, served):
        available = [served, *ALIASES, "jev-1.<n>"]
        raise schema_error(["model"], f"unknown model {parsed.model!r}; available: {available}")
    most = settings.max_deliberation_tokens
    return served, [
        build_spec(
            qid,
            q,
            settings.labels,
            settings.readout,
            most,
            settings.bias_correction,
            settings.normalization,
        )
        for qid, q in parsed.questions.items()
    ]


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


def ask(
    state: Content, specs: list[Spec], k: int, settings: Settings, prior: bool = True
) -> list[Rotated]:
    return [
        rotated(
            Question(
                path=f"questions.{spec.qid}",
                id=spec.qid,
                state=state,
                question=spec.instructions,
                descriptions=spec.descriptions,
                temperature=settings.temperature.for_type(spec.kind),
                # The fitted prior is the letters' position preference: letters only.
                log_position_prior=(
                    settings.position_prior.log_prior(spec.kind, len(spec.descriptions))
                    if prior and spec.readout == "letters"
                    else None
                ),
                readout=spec.readout,
                normalization=spec.normalization,
                bias_correction=spec.bias_correction,
                answers=spec.answers,
                deliberation_tokens=deliberation_budget(
                    spec.deliberation_tokens,
                    settings.max_deliberation_tokens,
                    f"questions.{spec.qid}",
                ),
                return_reasoning=spec.return_reasoning,
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
    served, specs = checked(parsed, settings, sha256)
    k = parsed.permutations or settings.permutations
    return Plan(
        parsed,
        served,
        specs,
        ask(parsed.state, specs, k, settings, parsed.position_prior),
        thresholds(parsed, settings),
    )


def evaluate(engine: DecisionEngine, planned: Plan) -> Evaluation:
    """Every question on the one prefix, in each of its option orders, as the engine scored it
    (before any batch correction). Runs on the engine thread."""
    try:
        return engine.evaluate_checked(rotations.flatten(planned.asked))
    except InvalidRequest as exc:
        raise schema_error(field_loc(exc.field or "body"), exc.message) from None


def answer(engine: DecisionEngine, planned: Plan, strict: bool) -> dict[str, Any]:
    """Every question answered, batch-corrected over this request's questions where asked;
    the `semif` diagnostics block unless strict. Runs on the engine thread."""
    lone = batch_bias.alone(rotations.flatten(planned.asked))
    if lone:  # before any work: its batch would be itself
        q = lone[0]
        hint = "; POST /v1/systemone/batch asks the same questions of many states"
        message = batch_bias.why_alone(q, "questions answered together", hint)
        raise schema_error(field_loc(f"{q.path}.bias_correction"), message)
    evaluation = evaluate(engine, planned)
    evaluation = replace(evaluation, scored=batch_bias.corrected(evaluation.scored))
    return render(engine, planned, evaluation, strict)


def render(
    engine: DecisionEngine, planned: Plan, evaluation: Evaluation, strict: bool
) -> dict[str, Any]:
    """The response from the rows as answered (batch-corrected where asked), combined over
    each question's rotations into its answer, each logged to SEMIF_ROWS_LOG."""
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
    for spec, asked, scored in zip(planned.specs, planned.asked, runs):
        orders = asked.orders
        probs, moved = rotations.combine([(o, s.probabilities) for o, s in zip(orders, scored)])
        answers[spec.qid] = answer_for(spec, probs, _threshold(planned, spec, strict))
        if not strict:
            # What the numbers are: letter logits, label sequences (over 26 options) or no
            # model call (one option). TypeSafe clients ignore extra keys; strict leaves them out.
            answers[spec.qid]["readout"] = scored[0].readout
            answers[spec.qid]["prompt_version"] = scored[0].prompt_version
            answers[spec.qid].update(reported(scored[0]))
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
            **(
                {"content_free_logits": [[float(v) for v in s.content_free_logits] for s in scored]}
                if scored[0].content_free_logits is not None
                else {}
            ),
            **(
                {
                    "batch": {
                        "size": scored[0].batch_size,
                        "mean_probabilities": [
                            [float(v) for v in s.batch_mean_probabilities] for s in scored
                        ],
                    }
                }
                if scored[0].batch_mean_probabilities is not None
                else {}
            ),
        }
    response: dict[str, Any] = {
        "model": planned.served,
        "answers": answers,
        # Output: the tokens deliberate questions wrote (every rotation's).
        "usage": {
            "input_tokens": evaluation.evaluated_tokens,
            "output_tokens": sum(s.deliberation.tokens for r in runs for s in r if s.deliberation),
        },
    }
    if not strict:
        response["semif"] = {
            "questions": diagnostics,
            "timing": evaluation.timing,
            "prompt_version": prompt_versions(s for r in runs for s in r),
            "model": engine.model_info,
        }
    return response
