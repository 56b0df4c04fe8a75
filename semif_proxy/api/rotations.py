"""Option-order rotations: which orders to ask, and how the answers are put back together.

Small models pick letters by position as much as by content (bench `order` suite: Qwen2.5-0.5B
chooses the first-listed option in 83 % of runs). Asking every cyclic rotation puts each option
in each position once, so the position preference cancels in the mean and what remains is the
evidence. Pure: no engine, no HTTP. One mechanism for both APIs (decisions and System One).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from semif_proxy.engine.questions import Question, Scored


def rotations(n: int, k: int) -> list[list[int]]:
    """k cyclic rotations of range(n), spread evenly over the n possible ones; the first is the
    request's own order."""
    k = max(1, min(k, n))
    return [[(j + (r * n) // k) % n for j in range(n)] for r in range(k)]


def back_to_request_order(order: list[int], values: np.ndarray) -> np.ndarray:
    """values[j] belongs to option order[j]; return them indexed by option."""
    out = np.zeros(len(order))
    out[order] = values
    return out


def combine(per_rotation: list[tuple[list[int], np.ndarray]]) -> tuple[np.ndarray, float]:
    """Mean of the rotated runs' probabilities, each mapped back to the request's order; and the
    share of runs whose argmax disagrees with the mean's argmax."""
    mapped = [back_to_request_order(order, probs) for order, probs in per_rotation]
    mean = np.mean(mapped, axis=0)
    top = int(np.argmax(mean))
    moved = sum(int(np.argmax(m)) != top for m in mapped) / max(len(mapped), 1)
    return mean, moved


@dataclass(frozen=True)
class Rotated:
    """One question asked in k option orders (orders[0] is the request's own)."""

    orders: list[list[int]]
    questions: list[Question]

    @classmethod
    def of(cls, base: Question, k: int) -> Rotated:
        orders = rotations(len(base.descriptions), k)
        asked = [replace(base, descriptions=tuple(base.descriptions[i] for i in o)) for o in orders]
        return cls(orders, asked)


def flatten(asked: Sequence[Rotated]) -> list[Question]:
    """Every order of every question, in one list: all of them are branches of one prefill."""
    return [q for r in asked for q in r.questions]


def regroup(asked: Sequence[Rotated], scored: Sequence[Scored]) -> list[list[Scored]]:
    """The engine's rows for flatten(asked), handed back per question."""
    runs, start = [], 0
    for r in asked:
        runs.append(list(scored[start : start + len(r.questions)]))
        start += len(r.questions)
    return runs
