"""Answers after a content-free state (issue #35): PMI for continuations and label-free
contextual bias correction (Zhao et al. 2021, "Calibrate before use") for any readout.

A question that needs them is asked a second time with the state replaced by a content-free
one ("N/A"), in the same request (its tokens count against the same budget; every such
question of a request shares that one state's prefill). Its numbers are kept per option set
(the readout, the question text, the listed descriptions in their order, the answer words, a
deliberate question's budget), so the next request on other evidence reads them from memory.

- pmi: a continuation's summed log-probability less the same option's summed log-probability
  after the content-free state.
- contextual: the probabilities are softmax(z - z_cf) (z: the readout's log-scores, z_cf: the
  same after the content-free state; for deliberate, the letters after the model's own
  reasoning about it), which is the answer distribution divided by the content-free one,
  renormalised. A position prior cancels out of the difference. With pmi the content-free
  distribution is uniform (its pmi is 0), so the correction leaves it as it is.

A part of DecisionEngine (worker.py), which holds what these read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import replace

import numpy as np

from semif_proxy import readout
from semif_proxy.engine.questions import (
    CONTINUATION,
    DELIBERATE,
    Evaluation,
    Question,
    Scored,
)
from semif_proxy.engine.readout_prompts import CONTENT_FREE_STATE


class ContentFreeCache:
    """Content-free option log-scores by option set, the least recently used dropped first."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._held: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self.hits = 0

    def get(self, key: Hashable) -> np.ndarray | None:
        value = self._held.get(key)
        if value is not None:
            self._held.move_to_end(key)
            self.hits += 1
        return value

    def put(self, key: Hashable, value: np.ndarray) -> None:
        self._held[key] = np.array(value, np.float64)
        self._held.move_to_end(key)
        while len(self._held) > self.entries:
            self._held.popitem(last=False)

    def __len__(self) -> int:
        return len(self._held)


def key(q: Question, normalization: str) -> Hashable:
    # A deliberate answer depends on how much the model may write first.
    budget = q.deliberation_tokens if q.readout == DELIBERATE else None
    return (q.readout, normalization, q.question, q.descriptions, q.answers, budget)


def content_free(q: Question, normalization: str) -> Question:
    """The question asked of the content-free state, read the same way (deliberate: it writes
    its own reasoning about "N/A" with the same budget, and its letters are read after that),
    uncorrected."""
    return replace(
        q,
        state=CONTENT_FREE_STATE,
        normalization=normalization,
        bias_correction="none",
        return_prompt=False,
        return_reasoning=False,
    )


def is_pmi(readout_name: str | None, normalization: str | None) -> bool:
    """pmi already takes the content-free answer off (its content-free distribution is
    uniform), so a contextual correction on top of it changes nothing and asks for no pass."""
    return readout_name == CONTINUATION and normalization == "pmi"


def needs(q: Question) -> list[str]:
    """The content-free normalisations a question needs ("sum" for pmi; its own for a
    contextual correction, none where that is uniform)."""
    if len(q.descriptions) < 2:
        return []
    pmi = is_pmi(q.readout, q.normalization)
    out = ["sum"] if pmi else []
    if q.bias_correction == "contextual" and not pmi:
        out.append(q.normalization)
    return out


class BiasCorrection:
    content_free: ContentFreeCache

    def _evaluate(self, questions: Sequence[Question]) -> Evaluation: ...  # worker.py

    def _evaluate_corrected(self, questions: Sequence[Question]) -> Evaluation:
        """_evaluate, with the content-free answers the questions need asked alongside (those
        not held yet) and applied. Questions that need none get _evaluate's rows as they are."""
        wanted = {(i, n): key(q, n) for i, q in enumerate(questions) for n in needs(q)}
        if not wanted:
            return self._evaluate(questions)
        # Held answers are read once, before the fresh ones are put: a put may evict them.
        held = {k: self.content_free.get(k) for k in set(wanted.values())}
        missing: dict[Hashable, Question] = {}
        for (i, n), k in wanted.items():
            if held[k] is None and k not in missing:
                missing[k] = content_free(questions[i], n)
        evaluation = self._evaluate([*questions, *missing.values()])
        rows = evaluation.scored[: len(questions)]
        for k, row in zip(missing, evaluation.scored[len(questions) :]):
            self.content_free.put(k, row.option_logits)
            held[k] = row.option_logits
        out = list(rows)
        for i, q in enumerate(questions):
            ns = needs(q)
            if ns:
                out[i] = corrected(rows[i], [held[wanted[(i, n)]] for n in ns])
        return Evaluation(out, evaluation.timing, evaluation.evaluated_tokens)


def corrected(row: Scored, free: list[np.ndarray | None]) -> Scored:
    q = row.question
    z = np.asarray(row.option_logits, np.float64)
    pmi = is_pmi(q.readout, q.normalization)
    if pmi:
        sums = free.pop(0)
        assert sums is not None
        z = z - sums
    prior = np.zeros(len(z)) if q.log_position_prior is None else np.asarray(q.log_position_prior)
    if q.bias_correction != "contextual":
        probs = readout.softmax(z - prior, q.temperature)
        return replace(row, option_logits=z, probabilities=probs)
    z_cf = np.zeros(len(z)) if pmi else np.asarray(free.pop(0), np.float64)
    # softmax((z - prior)/T) / softmax((z_cf - prior)/T), renormalised: the prior cancels.
    probs = readout.softmax(z - z_cf, q.temperature)
    return replace(row, option_logits=z, probabilities=probs, content_free_logits=z_cf)
