"""The reference every readout's exactness test holds its numbers to: the raw engine's
full-vocabulary logits at the end of a token sequence (or at its last n positions) evaluated
whole, from an empty state."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from semif_proxy.engine.native import Engine
    from semif_proxy.engine.worker import DecisionEngine


def one_piece(engine: DecisionEngine, tokens: list[int]) -> tuple[np.ndarray, float]:
    """The raw engine's logits at the end of `tokens` evaluated whole, and its logsumexp."""
    engine.core.reset()
    logits, lse, _ = engine.core.score(tokens, [[]], list(range(engine.core.n_vocab)))
    return logits[0].astype(np.float64), float(lse[0])


def rows_whole(core: Engine, tokens: list[int], n: int, ids: list[int]) -> tuple[np.ndarray, list]:
    """The raw core's logits of `ids` at the last n positions of `tokens` evaluated whole (one
    stream of ubatches from an empty state, those n rows the outputs), and their logsumexps."""
    core.reset()
    logits, lse, _ = core.score([], [tokens], ids, "restore", [n])
    assert logits.shape[0] == n
    return logits.astype(np.float64), [float(v) for v in lse]


def one_piece_rows(engine: DecisionEngine, tokens: list[int], n: int) -> tuple[np.ndarray, list]:
    """rows_whole over the whole vocabulary."""
    return rows_whole(engine.core, tokens, n, list(range(engine.core.n_vocab)))


def continuation_logprobs(core: Engine, prefix: list[int], conts: list[list[int]]) -> np.ndarray:
    """Each continuation's summed log-probability after `prefix`, from one-piece evaluations:
    prefix + the continuation but its last token evaluated whole from an empty state, the rows
    at its last len(continuation) positions read (no branches, no shared state)."""
    out = []
    for cont in conts:
        ids = sorted(set(cont))
        logits, lse = rows_whole(core, [*prefix, *cont[:-1]], len(cont), ids)
        out.append(sum(logits[t, ids.index(tok)] - lse[t] for t, tok in enumerate(cont)))
    core.reset()
    return np.array(out)
