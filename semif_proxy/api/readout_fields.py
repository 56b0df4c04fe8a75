"""The readout fields both APIs share (issue #35): `readout`, `normalization` and
`bias_correction` on a decision or a System One question, the answer words a direct readout
reads, the rotations that keep those words with their options, and what an answer reports.
Pure: no engine, no HTTP."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from semif_proxy.api.rotations import Rotated
from semif_proxy.settings.defaults import (
    DEFAULT_BIAS_CORRECTION,
    DEFAULT_NORMALIZATION,
    DEFAULT_READOUT,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from semif_proxy.engine.questions import Question, Scored

Readout = Literal["letters", "continuation", "direct"]
Normalization = Literal["sum", "mean", "pmi"]
BiasCorrection = Literal["none", "contextual"]

DIRECT_NEEDS = (
    "direct reads yes/no and score questions only: two options with the ids yes and no (or "
    "true and false), or options whose ids are the level numbers in order (0..n-1 or 1..n, "
    "at most 0..9); use readout letters or continuation"
)


def normalization_error(readout: str, normalization: str | None) -> str | None:
    """A normalisation sent with a readout that has none, or None when the pair is fine."""
    if normalization is not None and readout != "continuation":
        return f"normalization applies to readout continuation only, not {readout}"
    return None


def direct_answers(option_ids: Sequence[str]) -> tuple[str, ...] | None:
    """The answer word of each option when the options are yes/no or score levels: "yes" /
    "no" for ids yes/no or true/false, the level number for ids 0..n-1 or 1..n in order (one
    digit each); None otherwise."""
    ids = [i.strip().lower() for i in option_ids]
    if len(ids) == 2 and sorted(ids) == ["no", "yes"]:
        return tuple(ids)
    if len(ids) == 2 and sorted(ids) == ["false", "true"]:
        return tuple("yes" if i == "true" else "no" for i in ids)
    if len(ids) >= 2 and all(i.isdigit() and len(i) == 1 for i in ids):
        start = int(ids[0])
        if start in (0, 1) and [int(i) for i in ids] == list(range(start, start + len(ids))):
            return tuple(ids)
    return None


def rotated(base: Question, k: int) -> Rotated:
    """Rotated.of, with a direct question's answer words moved with their options."""
    asked = Rotated.of(base, k)
    if base.answers is None:
        return asked
    words = base.answers
    questions = [
        replace(q, answers=tuple(words[i] for i in order))
        for q, order in zip(asked.questions, asked.orders)
    ]
    return Rotated(asked.orders, questions)


def reported(scored: Scored) -> dict[str, Any]:
    """What an answer says about its readout beyond `readout` and `prompt_version`: the
    normalisation of a continuation, a bias correction when one was applied."""
    q = scored.question
    out: dict[str, Any] = {}
    if q.readout == "continuation":
        out["normalization"] = q.normalization
    if q.bias_correction != DEFAULT_BIAS_CORRECTION:
        out["bias_correction"] = q.bias_correction
    return out


__all__ = [
    "DEFAULT_BIAS_CORRECTION",
    "DEFAULT_NORMALIZATION",
    "DEFAULT_READOUT",
    "DIRECT_NEEDS",
    "BiasCorrection",
    "Normalization",
    "Readout",
    "direct_answers",
    "normalization_error",
    "reported",
    "rotated",
]
