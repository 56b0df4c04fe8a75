"""Option-order rotations: which orders to ask, and how the answers are put back together.

Small models pick letters by position as much as by content (bench `order` suite: Qwen2.5-0.5B
chooses the first-listed option in 83 % of runs). Asking every cyclic rotation puts each option
in each position once, so the position preference cancels in the mean and what remains is the
evidence. Pure numpy: no engine, no HTTP.
"""

from __future__ import annotations

import numpy as np


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
