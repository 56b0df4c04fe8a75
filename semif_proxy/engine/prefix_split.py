"""The prefix split: where one evaluated state stops and each question's own suffix starts.
A split is used only where it is proven (the state's own tokens are the start of every
prompt, token for token) and aligned (on a KV cell boundary), which is what makes a decision's
numbers those of its one-piece prompt."""

from __future__ import annotations

from collections.abc import Sequence

# BPE vocabularies often merge the state's closing quote with the comma that follows
# ('",'); the split then moves back a token or two. Any further and the split is refused.
BOUNDARY_SLACK = 4


def shared_prefix(state_tokens: Sequence[int], fulls: Sequence[Sequence[int]]) -> list[int]:
    """The longest token prefix that the state's own tokens and every full prompt agree on, and
    that leaves each prompt at least one token to decode. This is the proof that one prefill
    serves every question: it *is* the start of each prompt, token for token."""
    limit = min([len(state_tokens)] + [len(f) - 1 for f in fulls])
    k = 0
    while k < limit and all(f[k] == state_tokens[k] for f in fulls):
        k += 1
    return list(state_tokens[:k])


def aligned_length(proven: int, cell_align: int) -> int:
    """Where the split goes: the proven prefix cut back to a multiple of the KV cell alignment,
    so the first suffix sits exactly where its tokens sit when the whole prompt is evaluated at
    once (and every other suffix on an aligned cell too, see engine.cpp). Splitting mid-chunk
    moved letter log-probs by up to 0.3 (measured on SmolLM2 over every split point of one
    prompt)."""
    return proven - proven % cell_align


def split(
    state_tokens: list[int], fulls: Sequence[list[int]], cell_align: int
) -> tuple[list[int], int]:
    """The aligned prefix every prompt shares (empty when no split can be trusted) and the
    boundary: how many of the state's own tokens the proof lost to a merge at its end."""
    proof = shared_prefix(state_tokens, fulls)
    boundary = len(state_tokens) - len(proof)
    if boundary > BOUNDARY_SLACK:
        return [], boundary
    # Looked up on the module when called, so a test can move every split off the grid.
    return proof[: aligned_length(len(proof), cell_align)], boundary
