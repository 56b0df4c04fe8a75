"""A System One question as the engine asks it (a `Spec`): its option ids, the texts the model
reads, and how they are read (its own readout fields, else the server's SEMIF_READOUT), with
the request's readout fields checked against the question (422 at the field)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from semif_proxy.api.readout_fields import (
    DEFAULT_BIAS_CORRECTION,
    DEFAULT_NORMALIZATION,
    DEFAULT_READOUT,
    DIRECT_NEEDS,
    corrected_by,
    deliberation_error,
    direct_answers,
    normalization_error,
    resolved,
)
from semif_proxy.api.systemone_schemas import (
    DEFAULT_INSTRUCTIONS,
    ChoiceQuestion,
    Content,
    NoulCriteria,
    NoulQuestion,
    ScoreQuestion,
    schema_error,
)
from semif_proxy.engine.prompt import NUMBER_LABELS, labels_for
from semif_proxy.settings.readouts import BiasCorrections, Normalizations, Readouts


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
    readout: str = DEFAULT_READOUT
    normalization: str = DEFAULT_NORMALIZATION
    bias_correction: str = DEFAULT_BIAS_CORRECTION
    answers: tuple[str, ...] | None = None  # direct: each option's answer word
    deliberation_tokens: int | None = None  # deliberate: as asked (None: the default)
    return_reasoning: bool = False


def build_spec(
    qid: str,
    q: NoulQuestion | ChoiceQuestion | ScoreQuestion,
    labels: str = "auto",
    defaults: Readouts | None = None,
    most: int | None = None,
    biases: BiasCorrections | None = None,
    normalizations: Normalizations | None = None,
) -> Spec:
    """A question as the engine asks it, read as it asks (422 at its readout fields when they
    do not fit it). `labels`: SEMIF_LABELS (lettered options lettered or numbered);
    `defaults`: SEMIF_READOUT; `most`: SEMIF_MAX_DELIBERATION_TOKENS; `biases`:
    SEMIF_BIAS_CORRECTION; `normalizations`: SEMIF_NORMALIZATION (a continuation's only)."""
    spec = _options(qid, q, labels)
    fits = spec.kind != "choice" and direct_answers(spec.option_ids) is not None
    default = (defaults or Readouts()).for_type(spec.kind)
    how = resolved(q.readout, default, spec.descriptions, fits)
    bias = (biases or BiasCorrections()).for_type(spec.kind)
    correction = corrected_by(q.bias_correction, bias, how)
    problem = normalization_error(how, q.normalization)
    if problem:
        raise schema_error(["questions", qid, "normalization"], problem)
    if how == "direct" and not fits:
        raise schema_error(["questions", qid, "readout"], DIRECT_NEEDS)
    wrong = deliberation_error(how, q.deliberation_tokens, q.return_reasoning, most)
    if wrong:
        raise schema_error(["questions", qid, wrong[0]], wrong[1])
    return replace(
        spec,
        readout=how,
        normalization=q.normalization
        or (
            (normalizations or Normalizations()).for_type(spec.kind)
            if how == "continuation"
            else DEFAULT_NORMALIZATION
        ),
        bias_correction=correction,
        answers=direct_answers(spec.option_ids) if how == "direct" else None,
        deliberation_tokens=q.deliberation_tokens,
        return_reasoning=q.return_reasoning,
    )


def _options(
    qid: str, q: NoulQuestion | ChoiceQuestion | ScoreQuestion, labels: str = "auto"
) -> Spec:
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
