"""The decisions API (`/v1/decisions`, decision-shaped `/invocations`, `semif-proxy decide`)
mapped onto the decision engine: a request becomes engine questions (each in the option orders
it asks for), the engine's scored rows become result bodies.

No HTTP here: the route parses the body, runs `answer` on the engine thread and renders it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from semif_proxy.api import rotations, rows_log
from semif_proxy.api.readout_fields import (
    DEFAULT_BIAS_CORRECTION,
    DEFAULT_NORMALIZATION,
    DEFAULT_READOUT,
    corrected_by,
    deliberation_budget,
    reported,
    resolved,
    rotated,
)
from semif_proxy.api.rotations import Rotated
from semif_proxy.api.schemas import (
    Decision,
    SharedRequest,
    SingleRequest,
    check_count,
    check_readouts,
    check_shared,
    parse,
)
from semif_proxy.engine import batch_bias
from semif_proxy.engine.prompt import prompt_sha256
from semif_proxy.engine.questions import Evaluation, Question, Scored
from semif_proxy.engine.worker import DecisionEngine
from semif_proxy.errors import InvalidRequest


@dataclass(frozen=True)
class DecisionRequest:
    """A validated decisions request: its decisions, their field paths, and its shape."""

    decisions: list[Decision]
    paths: list[str]
    single: bool  # {"decision": ...} rather than {"decisions": [...]}


def parse_request(
    body: dict[str, Any],
    max_decisions: int | None = None,
    max_options: int | None = None,
    default_readout: str = DEFAULT_READOUT,
    default_bias: str = DEFAULT_BIAS_CORRECTION,
    default_normalization: str = DEFAULT_NORMALIZATION,
) -> DecisionRequest:
    """Validate a body of either shape (400/413 with the exact field on failure); the count
    limits are SEMIF_MAX_DECISIONS and SEMIF_MAX_OPTIONS on the server, none on the command
    line (past the API's own 255 options). A decision that names no readout gets
    `default_readout` (SEMIF_READOUT's for decisions), so that it is checked as it is read;
    likewise its bias correction and, read by continuation, its normalisation."""
    if max_decisions is not None and isinstance(body.get("decisions"), list):
        # Counted before validation: validating (and reporting) a million bad entries is
        # seconds of work and gigabytes of error objects on the event loop.
        check_count(len(body["decisions"]), "decisions", max_decisions)
    if max_options is not None:
        listed = [("decision", body.get("decision"))]
        if isinstance(body.get("decisions"), list):
            listed = [(f"decisions[{i}]", d) for i, d in enumerate(body["decisions"])]
        for path, decision in listed:
            options = decision.get("options") if isinstance(decision, dict) else None
            if isinstance(options, list):
                check_count(len(options), f"{path}.options", max_options, "SEMIF_MAX_OPTIONS")
    if "decision" in body:
        single = parse(SingleRequest, body)
        asked = [_read_as(single.decision, default_readout, default_bias, default_normalization)]
        check_readouts(asked, ["decision"])
        return DecisionRequest(asked, ["decision"], single=True)
    shared = parse(SharedRequest, body)
    check_shared(shared)
    paths = [f"decisions[{i}]" for i in range(len(shared.decisions))]
    asked = [
        _read_as(d, default_readout, default_bias, default_normalization) for d in shared.decisions
    ]
    check_readouts(asked, paths)
    return DecisionRequest(asked, paths, single=False)


def _read_as(
    decision: Decision,
    default: str,
    bias: str = DEFAULT_BIAS_CORRECTION,
    normalization: str = DEFAULT_NORMALIZATION,
) -> Decision:
    """The decision with the readout, bias correction and normalisation it is read by: its
    own, else the server's defaults for decisions (SEMIF_READOUT, SEMIF_BIAS_CORRECTION,
    SEMIF_NORMALIZATION: a continuation's only)."""
    descriptions = [o.description for o in decision.options]
    fits = decision.answers() is not None
    readout = resolved(decision.readout, default, descriptions, fits)
    correction = corrected_by(decision.bias_correction, bias, readout)
    norm = decision.normalization
    if norm is None and readout == "continuation":
        norm = normalization
    read = (readout, correction, norm)
    if read == (decision.readout, decision.bias_correction, decision.normalization):
        return decision
    return decision.model_copy(
        update={"readout": readout, "bias_correction": correction, "normalization": norm}
    )


def rotated_questions(
    engine: DecisionEngine, decisions: Sequence[Decision], paths: Sequence[str]
) -> list[Rotated]:
    """Each decision in the option orders it is asked in: its own order first, then the
    rotations it asks for (or SEMIF_PERMUTATIONS)."""
    settings = engine.settings
    temperature = settings.temperature.for_type("decision")
    prior = settings.position_prior
    # Decisions that reach here unparsed (tests, eval's rows) get the server's readout too.
    default, bias, norm = (
        settings.readout.for_type("decision"),
        settings.bias_correction.for_type("decision"),
        settings.normalization.for_type("decision"),
    )
    decisions = [_read_as(d, default, bias, norm) for d in decisions]
    return [
        rotated(
            Question(
                path=path,
                id=d.id,
                state=d.state,
                question=d.question,
                descriptions=tuple(o.description for o in d.options),
                temperature=temperature,
                return_prompt=d.return_prompt,
                # The fitted prior is the letters' position preference: letters only.
                log_position_prior=(
                    prior.log_prior("decision", len(d.options))
                    if d.position_prior and d.readout == "letters"
                    else None
                ),
                readout=d.readout,
                normalization=d.normalization or DEFAULT_NORMALIZATION,
                bias_correction=d.bias_correction,
                answers=d.answers() if d.readout == "direct" else None,
                deliberation_tokens=deliberation_budget(
                    d.deliberation_tokens, settings.max_deliberation_tokens, path
                ),
                return_reasoning=d.return_reasoning,
            ),
            d.permutations or settings.permutations,
        )
        for d, path in zip(decisions, paths)
    ]


def rotation_fields(orders: list[list[int]], runs: Sequence[Scored]) -> dict[str, Any]:
    """The mean over rotations, in the request's option order. `prompt` and `prompt_sha256`
    stay those of the request's own order; the logits of every rotation are reported."""
    probs, moved = rotations.combine([(o, r.probabilities) for o, r in zip(orders, runs)])
    logits = [rotations.back_to_request_order(o, r.option_logits) for o, r in zip(orders, runs)]
    return {
        "probabilities": [float(p) for p in probs],
        "option_logits": [float(v) for v in np.mean(logits, axis=0)],
        "input_tokens": sum(r.input_tokens for r in runs),
        "allowed_token_mass": float(np.mean([r.allowed_token_mass for r in runs])),
        "readout": f"{runs[0].readout}, mean of {len(runs)} rotations",
        "rotations": {
            "orders": orders,
            "option_logits": [[float(v) for v in row] for row in logits],
            "argmax_moved": moved,
        },
    }


def result_body(
    model_info: dict[str, Any],
    decision: Decision,
    orders: list[list[int]],
    runs: Sequence[Scored],
    timing: dict[str, Any],
) -> dict[str, Any]:
    first = runs[0]
    body: dict[str, Any] = {
        "id": decision.id,
        "option_ids": [o.id for o in decision.options],
        "probabilities": [float(p) for p in first.probabilities],
        "option_logits": [float(v) for v in first.option_logits],
        "input_tokens": first.input_tokens,
        "allowed_token_mass": first.allowed_token_mass,
        "prompt_sha256": prompt_sha256(first.prompt),
        "prompt_version": first.prompt_version,
        "readout": first.readout,
        **reported(first),
        # Whether a fitted position prior (SEMIF_CALIBRATION) was divided out of probabilities.
        "position_prior": first.question.position_prior,
        "model": model_info,
        "timing": {
            "forward_seconds": timing["forward_seconds"],
            "total_seconds": timing["total_seconds"],
        },
    }
    if len(runs) > 1:
        body.update(rotation_fields(orders, runs))
    if first.content_free_logits is not None:
        body["content_free_logits"] = [float(v) for v in first.content_free_logits]
    if first.batch_mean_probabilities is not None:
        # The request's own order's batch (each rotation is calibrated with its own).
        body["batch"] = {
            "size": first.batch_size,
            "mean_probabilities": [float(v) for v in first.batch_mean_probabilities],
        }
    if first.first_token_logits is not None:
        body["first_token_logits"] = [float(v) for v in first.first_token_logits]
    if decision.return_prompt:
        body["prompt"] = first.prompt
    return body


def evaluate(
    engine: DecisionEngine, decisions: Sequence[Decision], paths: Sequence[str]
) -> tuple[list[Rotated], Evaluation]:
    """Each decision's questions (in the option orders it asks for) and their rows as the
    engine scored them, before any batch correction. Runs on the engine thread."""
    asked = rotated_questions(engine, decisions, paths)
    return asked, engine.evaluate_checked(rotations.flatten(asked))


def render(
    engine: DecisionEngine,
    decisions: Sequence[Decision],
    asked: Sequence[Rotated],
    evaluation: Evaluation,
) -> list[dict[str, Any]]:
    """Result bodies in request order from the rows as answered (batch-corrected where asked),
    each logged to SEMIF_ROWS_LOG."""
    runs = rotations.regroup(list(asked), evaluation.scored)
    rows_log.record(
        engine.settings.rows_log,
        (
            rows_log.question_line(
                engine.model_info,
                "decisions",
                "decision",
                d.id,
                [o.id for o in d.options],
                r.orders,
                scored,
            )
            for d, r, scored in zip(decisions, asked, runs)
            if len(d.options) > 1  # one option: no model call, nothing to learn from
        ),
    )
    return [
        result_body(engine.model_info, d, r.orders, scored, evaluation.timing)
        for d, r, scored in zip(decisions, asked, runs)
    ]


def decide(
    engine: DecisionEngine, decisions: Sequence[Decision], paths: Sequence[str]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Result bodies in request order, and the request's timing; a batch correction over this
    request's decisions. Runs on the engine thread."""
    asked = rotated_questions(engine, decisions, paths)
    flat = rotations.flatten(asked)
    lone = batch_bias.alone(flat)
    if lone:  # before any work: its batch would be itself
        raise InvalidRequest(
            batch_bias.why_alone(
                lone[0],
                "decisions answered together",
                "; a request's decisions share one state: send each decision as a line of one "
                "JSON Lines body on POST /invocations",
            ),
            field=f"{lone[0].path}.bias_correction",
        )
    evaluation = engine.evaluate_checked(flat)
    evaluation = replace(evaluation, scored=batch_bias.corrected(evaluation.scored))
    return render(engine, decisions, asked, evaluation), evaluation.timing


def tokens_of(results: Sequence[dict[str, Any]]) -> int:
    return sum(r["input_tokens"] for r in results)


def answer_body(
    request: DecisionRequest, results: list[dict[str, Any]], timing: dict[str, Any]
) -> dict[str, Any]:
    """The response body of the request's shape."""
    if request.single:
        return {"result": results[0]}
    return {"results": results, "timing": timing}


def answer(engine: DecisionEngine, request: DecisionRequest) -> tuple[dict[str, Any], int]:
    """The response body of either shape, and the prompt tokens it counted (for the access
    log). Runs on the engine thread."""
    results, timing = decide(engine, request.decisions, request.paths)
    return answer_body(request, results, timing), tokens_of(results)
