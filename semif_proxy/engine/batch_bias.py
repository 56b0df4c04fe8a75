"""Label-free batch calibration (issue #35; Zhou et al. 2024, "Batch Calibration"): the mean
answer distribution over a batch of unlabelled questions that list the same options, divided
out of each one's probabilities.

A question asks for it with `bias_correction: "batch"`. Its batch is the questions answered
together that share its key: the same readout, normalisation, question text, answer words and
options in the same listed order (so each rotation of a permuted question is calibrated with
the same rotation of the others). The batch is what one call answers over several states: the
states of a System One batch, the lines of a JSON Lines body. (A decisions request or a single
System One request has one state: `batch` there is refused.)

For the questions i of one batch, with served probabilities p_i (after the temperature and a
position prior), the mean p = mean_i p_i is the batch's answer bias, and each question's
corrected probabilities are p_i / p, renormalised. Unlike contextual correction this costs no
model call; it needs at least MIN_BATCH different states asking each key (the questions of
one state are one prompt with one answer, which divided by itself is uniform: a request where
that would happen is refused, naming the question).

Pure: no engine calls, no HTTP; the services apply it after evaluating and before rendering.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from semif_proxy.engine.questions import Question, Scored

BATCH = "batch"
MIN_BATCH = 2


def asks(q: Question) -> bool:
    """Whether the question is batch-calibrated (one option: probability 1, nothing to do)."""
    return q.bias_correction == BATCH and len(q.descriptions) > 1


def key(q: Question) -> Hashable:
    """What makes questions one batch: asked and read the same way over the same listed
    options, so that their answer distributions differ only by their states. (Rotations of one
    question with repeated descriptions share a key; their prompts are then the same too.)"""
    return (
        q.readout,
        q.normalization,
        q.question,
        q.descriptions,
        q.answers,
        q.temperature,
        q.log_position_prior,
    )


def state_key(state: Any) -> str:
    # The state as the prompt renders it: two states that render alike are one state.
    return state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)


def alone(questions: Iterable[Question]) -> list[Question]:
    """The batch-calibrated questions whose key fewer than MIN_BATCH different states ask: the
    mean over one state's answers is that answer, and dividing it out leaves a uniform one."""
    states: dict[Hashable, set[str]] = {}
    asked = [q for q in questions if asks(q)]
    for q in asked:
        states.setdefault(key(q), set()).add(state_key(q.state))
    return [q for q in asked if len(states[key(q)]) < MIN_BATCH]


def why_alone(q: Question, batch: str, hint: str = "") -> str:
    """The 400 message for a question `alone` found, naming its field and what it needs."""
    return (
        f"{q.path}.bias_correction: batch divides out the mean answer over the {batch} that "
        "ask the same question with the same readout and options in the same order (and the "
        f"same permutations); it needs at least {MIN_BATCH} different states asking it, and "
        f"this one's state has no other{hint}"
    )


def corrected(rows: Sequence[Scored]) -> list[Scored]:
    """The rows with every batch-calibrated one's probabilities divided by its batch's mean,
    renormalised; other rows as they are. A key fewer than MIN_BATCH states ask is left
    uncorrected (callers refuse those first, see `alone`)."""
    groups: dict[Hashable, list[int]] = {}
    for i, row in enumerate(rows):
        if asks(row.question):
            groups.setdefault(key(row.question), []).append(i)
    out = list(rows)
    for members in groups.values():
        if len({state_key(rows[i].question.state) for i in members}) < MIN_BATCH:
            continue
        probs = np.asarray([rows[i].probabilities for i in members], np.float64)
        mean = probs.mean(axis=0)
        for i, p in zip(members, probs):
            # An option no question of the batch gives any probability keeps none.
            ratio = np.divide(p, mean, out=np.zeros_like(p), where=mean > 0)
            out[i] = replace(
                rows[i],
                probabilities=ratio / ratio.sum(),
                batch_mean_probabilities=mean,
                batch_size=len(members),
            )
    return out


def corrected_across(parts: Sequence[Sequence[Scored]]) -> list[list[Scored]]:
    """`corrected` over several requests' rows as one batch (a System One batch's states, a
    JSON Lines body's lines), handed back request by request."""
    flat = corrected([row for part in parts for row in part])
    out, at = [], 0
    for part in parts:
        out.append(flat[at : at + len(part)])
        at += len(part)
    return out
