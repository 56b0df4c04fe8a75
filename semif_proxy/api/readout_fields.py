"""The readout fields both APIs share (issue #35): `readout`, `normalization` and
`bias_correction` on a decision or a System One question (and deliberate's
`deliberation_tokens` and `return_reasoning`), the answer words a direct readout reads, the
rotations that keep those words with their options, and what an answer reports.
Pure: no engine calls, no HTTP."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from semif_proxy.api.rotations import Rotated
from semif_proxy.engine.prompt import LETTERS
from semif_proxy.errors import InvalidRequest
from semif_proxy.settings.defaults import (
    DEFAULT_BIAS_CORRECTION,
    DEFAULT_DELIBERATION_TOKENS,
    DEFAULT_NORMALIZATION,
    DEFAULT_READOUT,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from semif_proxy.engine.questions import Question, Scored

Readout = Literal["letters", "continuation", "direct", "deliberate"]
Normalization = Literal["sum", "mean", "pmi"]
BiasCorrection = Literal["none", "contextual", "batch"]

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


def resolved(
    asked: str | None, default: str, descriptions: Sequence[str], direct_fits: bool
) -> str:
    """The readout a question is read by: its own `readout`, else the server's for its type
    (SEMIF_READOUT). A default answers every question: where the question is one the default
    readout refuses (direct: not yes/no or levels; deliberate: over 26 options; continuation:
    an empty description), it is read by letters. The same readout asked for by the request
    itself is refused there instead, naming the field."""
    if asked is not None:
        return asked
    refused = (
        (default == "direct" and not direct_fits)
        or (default == "deliberate" and len(descriptions) > len(LETTERS))
        or (default == "continuation" and any(not d.strip() for d in descriptions))
    )
    return "letters" if refused else default


def corrected_by(asked: str | None, default: str, readout: str) -> str:
    """The bias correction a question gets: its own `bias_correction`, else the server's for its
    type (SEMIF_BIAS_CORRECTION), which leaves deliberate questions uncorrected: their
    content-free answer is a second deliberation, a cost asked for by name only."""
    if asked is not None:
        return asked
    return DEFAULT_BIAS_CORRECTION if readout == "deliberate" else default


def deliberation_error(
    readout: str, deliberation_tokens: int | None, return_reasoning: bool, most: int | None = None
) -> tuple[str, str] | None:
    """A deliberation field sent with a readout that writes no reasoning, or a budget over
    `most` (SEMIF_MAX_DELIBERATION_TOKENS), as (field, problem); None when they are fine."""
    if readout == "deliberate":
        if most is not None and deliberation_tokens is not None and deliberation_tokens > most:
            return "deliberation_tokens", (
                f"{deliberation_tokens} is over the limit of {most} (SEMIF_MAX_DELIBERATION_TOKENS)"
            )
        return None
    if deliberation_tokens is not None:
        return "deliberation_tokens", f"applies to readout deliberate only, not {readout}"
    if return_reasoning:
        return "return_reasoning", f"applies to readout deliberate only, not {readout}"
    return None


def deliberation_budget(asked: int | None, most: int, path: str) -> int:
    """A question's deliberation_tokens: as asked (a 400 naming the field over `most`,
    SEMIF_MAX_DELIBERATION_TOKENS), else the default, at most `most`."""
    if asked is not None and asked > most:
        raise InvalidRequest(
            f"{path}.deliberation_tokens: {asked} is over the limit of {most} "
            "(SEMIF_MAX_DELIBERATION_TOKENS)",
            field=f"{path}.deliberation_tokens",
        )
    return asked if asked is not None else min(DEFAULT_DELIBERATION_TOKENS, most)


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
    normalisation of a continuation, a bias correction when one was applied, a deliberate
    answer's reasoning (its token count; its text when asked)."""
    q = scored.question
    out: dict[str, Any] = {}
    if q.readout == "continuation":
        out["normalization"] = q.normalization
    if q.bias_correction != DEFAULT_BIAS_CORRECTION:
        out["bias_correction"] = q.bias_correction
    if scored.deliberation is not None:
        # The request's own option order's reasoning (each rotation deliberates on its own).
        made = scored.deliberation
        ended = "end_of_turn" if made.ended else "budget"
        out["deliberation"] = {"tokens": made.tokens, "ended": ended}
        if q.return_reasoning:
            out["deliberation"]["text"] = made.text
    return out


__all__ = [
    "DEFAULT_BIAS_CORRECTION",
    "DEFAULT_NORMALIZATION",
    "DEFAULT_READOUT",
    "DIRECT_NEEDS",
    "BiasCorrection",
    "Normalization",
    "Readout",
    "corrected_by",
    "deliberation_budget",
    "deliberation_error",
    "direct_answers",
    "normalization_error",
    "reported",
    "resolved",
    "rotated",
]
