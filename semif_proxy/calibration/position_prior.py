"""Position-bias prior (PriDe: Zheng et al., "Large Language Models Are Not Robust Multiple
Choice Selectors", ICLR 2024): how much a model favours each listed position regardless of
what is listed there, estimated from questions asked in rotated option orders, and divided out
of each answer.

The model behind it: the log-probability the model gives position j of a question asked in
order r is log prior_j + log content(option at j) + a constant of that order. In a balanced set
of orders (every option stands in every position equally often; all n cyclic rotations are one)
the mean over orders of position j's log-probability is log prior_j plus the same constant for
every j: the content cancels. That needs no labels, only rotations. The per-question priors are
averaged over questions per question type and option count (PriDe's estimate), and the prior is
applied by subtracting its log from the option logits before the softmax (engine.Question's
`log_position_prior`): one pass, no extra forward.

Pure: numpy and pydantic, no engine, no HTTP.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from semif_proxy.calibration.question_types import DEFAULT, QUESTION_TYPES

# Question types a prior may be fitted for; "default" pools every type (used for a type that has
# no table of its own at that option count).
KINDS = (DEFAULT, *QUESTION_TYPES)
# The key of a `position_prior` block that holds the prompt version of each option count.
VERSIONS_KEY = "prompt_versions"
# Fewer questions than this at one (type, option count) fit no table there.
MIN_QUESTIONS = 5


class RowsError(ValueError):
    pass


class PositionPrior(BaseModel):
    """Fitted priors: question type -> option count -> the probability of each listed position
    (as `semif-proxy calibrate` writes them under `position_prior`). Each list is normalised
    here; only the ratios matter. `prompt_versions`: the prompt version (letters or numbers)
    the rows of each option count were asked with, where the rows said; a prior measured on
    lettered prompts says nothing about numbered ones (settings/env.py refuses the mismatch)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    tables: dict[str, dict[int, tuple[float, ...]]] = {}
    prompt_versions: dict[int, str] = {}

    @field_validator("tables")
    @classmethod
    def _valid(
        cls, tables: dict[str, dict[int, tuple[float, ...]]]
    ) -> dict[str, dict[int, tuple[float, ...]]]:
        out: dict[str, dict[int, tuple[float, ...]]] = {}
        for kind, by_n in tables.items():
            if kind not in KINDS:
                raise ValueError(f"position_prior: unknown question type {kind!r}; one of {KINDS}")
            out[kind] = {}
            for n, probs in by_n.items():
                where = f"position_prior.{kind}.{n}"
                if n < 2:
                    raise ValueError(f"{where}: an option count is at least 2")
                if len(probs) != n:
                    raise ValueError(f"{where}: {len(probs)} values for {n} positions")
                if not all(math.isfinite(p) and p > 0.0 for p in probs):
                    raise ValueError(f"{where}: every value must be a positive number")
                total = math.fsum(probs)
                out[kind][n] = tuple(p / total for p in probs)
        return out

    @field_validator("prompt_versions")
    @classmethod
    def _versions(cls, versions: dict[int, str]) -> dict[int, str]:
        for n in versions:
            if n < 2:
                raise ValueError(f"an option count is at least 2, got {n}")
        return versions

    def log_prior(self, kind: str, n: int) -> tuple[float, ...] | None:
        """The log prior of each listed position for a question of this type with n options:
        its own type's table, else the pooled `default` table, else None (no prior)."""
        probs = self.tables.get(kind, {}).get(n) or self.tables.get("default", {}).get(n)
        return None if probs is None else tuple(math.log(p) for p in probs)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            k: {str(n): list(p) for n, p in t.items()} for k, t in self.tables.items()
        }
        if self.prompt_versions:
            out[VERSIONS_KEY] = {str(n): v for n, v in sorted(self.prompt_versions.items())}
        return out


def from_json(value: Any) -> PositionPrior:
    """A `position_prior` block ({"choice": {"4": [...]}, "default": {"2": [...]}}, and
    optionally "prompt_versions": {"4": "semif-letter-v1"})."""
    if not isinstance(value, Mapping):
        raise ValueError("position_prior must be an object: {type: {option count: [values]}}")
    tables = {k: v for k, v in value.items() if k != VERSIONS_KEY}
    try:
        return PositionPrior(tables=tables, prompt_versions=value.get(VERSIONS_KEY, {}))
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = [str(p) for p in first["loc"]]
        # The tables are the block itself; prompt_versions is a key of it.
        where = ".".join(loc[1:] if loc and loc[0] == "tables" else loc)
        message = first["msg"].removeprefix("Value error, ")
        raise ValueError(f"position_prior.{where}: {message}" if where else message) from None


# -- fitting ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RotatedRow:
    """One question asked in several option orders: orders[r][j] is the option (its index in
    the request) listed at position j in order r; logits[r, j] the option logit read there."""

    kind: str
    orders: list[list[int]]
    logits: np.ndarray  # (orders, options), in presented order
    model: str | None = None
    prompt_version: str | None = None  # None: a line from before the rows log recorded it

    @property
    def n(self) -> int:
        return int(self.logits.shape[1])


def balanced(orders: Sequence[Sequence[int]], n: int) -> bool:
    """Each order a permutation of the n options, and every option in every position equally
    often (all n cyclic rotations, or any Latin set): then the content cancels in the means."""
    if not orders or any(sorted(o) != list(range(n)) for o in orders):
        return False
    counts = np.zeros((n, n), dtype=int)
    for order in orders:
        counts[np.arange(n), np.asarray(order)] += 1
    return bool((counts == counts[0, 0]).all())


def _log_softmax(x: np.ndarray) -> np.ndarray:
    top = x.max(axis=-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))


def question_prior(logits: np.ndarray) -> np.ndarray:
    """One question's prior over positions (probabilities), from its logits in a balanced set of
    orders: the softmax over positions of the mean over orders of each position's
    log-probability."""
    mean = _log_softmax(np.asarray(logits, dtype=np.float64)).mean(axis=0)
    return np.exp(_log_softmax(mean))


def estimate(rows: Sequence[RotatedRow]) -> np.ndarray:
    """The prior of a group of questions with the same option count: the mean of their
    per-question priors (PriDe)."""
    return np.mean([question_prior(r.logits) for r in rows], axis=0)


def first_listed_share(rows: Sequence[RotatedRow], log_prior: np.ndarray | None = None) -> float:
    """Over every order of every row: how often the answer is the option listed first."""
    picks = [
        int(np.argmax(row if log_prior is None else row - log_prior))
        for r in rows
        for row in r.logits
    ]
    return sum(p == 0 for p in picks) / max(len(picks), 1)


@dataclass(frozen=True)
class Fit:
    prior: PositionPrior
    report: dict[str, Any]


def fit(
    rows: Iterable[RotatedRow],
    min_questions: int = MIN_QUESTIONS,
    label_versions: frozenset[str] | None = None,
) -> Fit:
    """A table per (question type, option count) with at least min_questions balanced rows,
    and a pooled `default` table per option count over every type. Rows that are not balanced
    (one order, or rotations that leave some option out of some position) are counted and
    skipped. Rows of one option count asked with two prompt versions (letters and numbers,
    SEMIF_LABELS changed between them) are refused: their position biases are not one.
    `label_versions`: the prompt versions of the labelled readouts (letters, numbers); rows of
    any other (a continuation, direct or deliberate question's) are counted and skipped, since
    the prior is the labels' position preference and only they have it applied."""
    usable: list[RotatedRow] = []
    skipped = 0
    other_readouts = 0
    total = 0
    for row in rows:
        total += 1
        if (
            label_versions is not None
            and row.prompt_version is not None
            and row.prompt_version not in label_versions
        ):
            other_readouts += 1
        elif balanced(row.orders, row.n):
            usable.append(row)
        else:
            skipped += 1
    groups: dict[tuple[str, int], list[RotatedRow]] = {}
    versions: dict[int, set[str]] = {}
    for row in usable:
        groups.setdefault((row.kind, row.n), []).append(row)
        groups.setdefault((DEFAULT, row.n), []).append(row)
        if row.prompt_version is not None:
            versions.setdefault(row.n, set()).add(row.prompt_version)
    for n, asked in sorted(versions.items()):
        if len(asked) > 1:
            raise RowsError(
                f"rows with {n} options were asked with {len(asked)} prompt versions "
                f"({', '.join(sorted(asked))}); fit the rows of each version on their own"
            )
    tables: dict[str, dict[int, tuple[float, ...]]] = {}
    report: dict[str, Any] = {
        "rows": total,
        "balanced_rows": len(usable),
        "skipped_rows": skipped,
        "other_readout_rows": other_readouts,
        "min_questions": min_questions,
        "tables": {},
        "too_few": {},
    }
    for (kind, n), group in sorted(groups.items()):
        key = f"{kind}/{n}"
        if len(group) < min_questions:
            report["too_few"][key] = len(group)
            continue
        prior = estimate(group)
        tables.setdefault(kind, {})[n] = tuple(float(p) for p in prior)
        report["tables"][key] = {
            "questions": len(group),
            "prior": [float(p) for p in prior],
            # In sample: how often the first-listed option wins, over every order of the rows.
            "first_listed_before": first_listed_share(group),
            "first_listed_after": first_listed_share(group, np.log(prior)),
            "first_listed_if_position_blind": 1.0 / n,
        }
    fitted_counts = {n for by_n in tables.values() for n in by_n}
    prompt_versions = {n: next(iter(v)) for n, v in versions.items() if n in fitted_counts}
    return Fit(PositionPrior(tables=tables, prompt_versions=prompt_versions), report)


__all__ = [
    "KINDS",
    "MIN_QUESTIONS",
    "VERSIONS_KEY",
    "Fit",
    "PositionPrior",
    "RotatedRow",
    "RowsError",
    "balanced",
    "estimate",
    "first_listed_share",
    "fit",
    "from_json",
    "question_prior",
]
