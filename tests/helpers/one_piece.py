"""The reference every readout's exactness test holds its numbers to: the raw engine's
full-vocabulary logits at the end of a token sequence (or at its last n positions) evaluated
whole, from an empty state."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from semif_proxy.engine.worker import DecisionEngine


def one_piece(engine: DecisionEngine, tokens: list[int]) -> tuple[np.ndarray, float]:
    """The raw engine's logits at the end of `tokens` evaluated whole, and its logsumexp."""
    engine.core.reset()
    logits, lse, _ = engine.core.score(tokens, [[]], list(range(engine.core.n_vocab)))
    return logits[0].astype(np.float64), float(lse[0])


def one_piece_rows(engine: DecisionEngine, tokens: list[int], n: int) -> tuple[np.ndarray, list]:
    """The raw engine's logits at the last n positions of `tokens` evaluated whole (one stream
    of ubatches from an empty state, those n rows the outputs), and their logsumexps."""
    engine.core.reset()
    logits, lse, _ = engine.core.score(
        [], [tokens], list(range(engine.core.n_vocab)), "restore", [n]
    )
    assert logits.shape[0] == n
    return logits.astype(np.float64), [float(v) for v in lse]
