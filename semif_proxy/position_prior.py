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

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

# Question types a prior may be fitted for; "default" pools every type (used for a type that has
# no table of its own at that option count).
KINDS = ("default", "decision", "noul", "choice", "score")
# Fewer questions than this at one (type, option count) fit no table there.
MIN_QUESTIONS = 5


class RowsError(ValueError):
    pass


class PositionPrior(BaseModel):
    """Fitted priors: question type -> option count -> the probability of each listed position
    (as `semif-proxy calibrate` writes them under `position_prior`). Each list is normalised
    here; only the ratios matter."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    tables: dict[str, dict[int, tuple[float, ...]]] = {}

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

    def log_prior(self, kind: str, n: int) -> tuple[float, ...] | None:
        """The log prior of each listed position for a question of this type with n options:
        its own type's table, else the pooled `default` table, else None (no prior)."""
        probs = self.tables.get(kind, {}).get(n) or self.tables.get("default", {}).get(n)
        return None if probs is None else tuple(math.log(p) for p in probs)

    def as_json(self) -> dict[str, dict[str, list[float]]]:
        return {k: {str(n): list(p) for n, p in t.items()} for k, t in self.tables.items()}


def from_json(value: Any) -> PositionPrior:
    """A `position_prior` block ({"choice": {"4": [...]}, "default": {"2": [...]}})."""
    if not isinstance(value, Mapping):
        raise ValueError("position_prior must be an object: {type: {option count: [values]}}")
    try:
        return PositionPrior(tables=value)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"][1:])
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


def fit(rows: Iterable[RotatedRow], min_questions: int = MIN_QUESTIONS) -> Fit:
    """A table per (question type, option count) with at least min_questions balanced rows,
    and a pooled `default` table per option count over every type. Rows that are not balanced
    (one order, or rotations that leave some option out of some position) are counted and
    skipped."""
    usable: list[RotatedRow] = []
    skipped = 0
    total = 0
    for row in rows:
        total += 1
        if balanced(row.orders, row.n):
            usable.append(row)
        else:
            skipped += 1
    groups: dict[tuple[str, int], list[RotatedRow]] = {}
    for row in usable:
        groups.setdefault((row.kind, row.n), []).append(row)
        groups.setdefault(("default", row.n), []).append(row)
    tables: dict[str, dict[int, tuple[float, ...]]] = {}
    report: dict[str, Any] = {
        "rows": total,
        "balanced_rows": len(usable),
        "skipped_rows": skipped,
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
    return Fit(PositionPrior(tables=tables), report)


# -- the rows log's lines -----------------------------------------------------------------------


def parse_row(line: dict[str, Any], where: str) -> RotatedRow | None:
    """A line of the rows log (SEMIF_ROWS_LOG): {type, orders, option_logits, ...}; None for a
    one-option question (older logs hold them), which carries no position information."""
    kind = str(line.get("type", "decision"))
    if kind not in KINDS[1:]:
        raise RowsError(f"{where}: type {kind!r} is not one of {KINDS[1:]}")
    orders = line.get("orders")
    logits = line.get("option_logits")
    if not isinstance(orders, list) or not isinstance(logits, list) or not logits:
        raise RowsError(f"{where}: needs `orders` and `option_logits` (one list per order)")
    try:
        array = np.asarray(logits, dtype=np.float64)
    except (TypeError, ValueError):
        raise RowsError(f"{where}: option_logits must be lists of numbers") from None
    if array.ndim == 2 and array.shape[1] == 1 and all(o == [0] for o in orders):
        return None  # one option: answered without the model, nothing about positions in it
    if array.ndim != 2 or array.shape[1] < 2 or len(orders) != array.shape[0]:
        raise RowsError(
            f"{where}: option_logits must be one list of at least 2 numbers per order "
            f"({len(orders)} orders)"
        )
    if not np.isfinite(array).all():
        raise RowsError(f"{where}: option_logits must be finite")
    if not all(isinstance(o, list) and all(isinstance(i, int) for i in o) for o in orders):
        raise RowsError(f"{where}: orders must be lists of option indices")
    model = line.get("model")
    return RotatedRow(kind, orders, array, str(model) if model is not None else None)


def json_objects(path: Path, error: type[ValueError]) -> Iterator[tuple[str, dict[str, Any]]]:
    """A JSON Lines file's objects with where each one is ("file:line"); blank lines skipped,
    anything else that is not a JSON object raised as `error` naming its line."""
    with path.open(encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{number}: not JSON: {exc}") from None
            if not isinstance(line, dict):
                raise error(f"{path}:{number}: not a JSON object")
            yield f"{path}:{number}", line


def read_rows(path: Path) -> list[RotatedRow]:
    out = []
    for where, line in json_objects(path, RowsError):
        row = parse_row(line, where)
        if row is not None:
            out.append(row)
    if not out:
        raise RowsError(f"{path}: no rows")
    models = sorted({r.model for r in out if r.model is not None})
    if len(models) > 1:
        raise RowsError(
            f"{path}: rows of {len(models)} models ({', '.join(models)}); a prior belongs to "
            "one model: fit each model's rows on their own"
        )
    return out


__all__ = [
    "KINDS",
    "MIN_QUESTIONS",
    "Fit",
    "PositionPrior",
    "RotatedRow",
    "RowsError",
    "balanced",
    "estimate",
    "first_listed_share",
    "fit",
    "from_json",
    "parse_row",
    "question_prior",
    "read_rows",
]
