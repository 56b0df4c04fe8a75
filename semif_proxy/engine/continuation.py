"""The continuation readout's plan and numbers (issue #35): each option's own text scored as
the answer after the prompt.

An option's log-probability is the sum, over its tokens, of each token's log-probability after
the prompt and the option's tokens before it. Each of those next-token distributions is read
at the last position of its own context (prompt + the option's first k tokens), which the
engine evaluates as it evaluates a lettered prompt: after the shared state, on sequence 0, so
its numbers are those of that context evaluated in one piece (the exactness guarantee; a
context's one output row, as llama-server computes it). Options that begin alike share their
contexts. Pure: no engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Tokens = tuple[int, ...]


@dataclass(frozen=True)
class ContinuationRead:
    """One question's continuations: the contexts to read (each the option tokens after the
    prompt, cont[:k]) and, per option, its (context index, token) steps."""

    conts: tuple[Tokens, ...]
    contexts: tuple[Tokens, ...]
    steps: tuple[tuple[tuple[int, int], ...], ...]

    @property
    def targets(self) -> list[int]:
        return sorted({t for steps in self.steps for _, t in steps})

    def extra_tokens(self) -> int:
        """Tokens the contexts add after the prompt (each context evaluated on its own)."""
        return sum(len(c) for c in self.contexts)

    def longest(self) -> int:
        return max(len(c) for c in self.contexts)


def answer_tokens(
    prompt_tokens: list[int],
    description: str,
    tokenize_prompt: Callable[[str], list[int]],
    prompt_text: str,
    tokenize_text: Callable[[str], list[int]],
) -> Tokens:
    """The option's tokens as the answer: what prompt + description tokenizes to after the
    prompt's own tokens (as llama-server tokenizes an answered prompt), or the description's
    own tokens where the two merge at the boundary."""
    joined = tokenize_prompt(prompt_text + description)
    if joined[: len(prompt_tokens)] == prompt_tokens and len(joined) > len(prompt_tokens):
        return tuple(joined[len(prompt_tokens) :])
    return tuple(tokenize_text(description))


def plan(conts: Sequence[Tokens]) -> ContinuationRead:
    index: dict[Tokens, int] = {}
    steps = []
    for cont in conts:
        own = []
        for k, token in enumerate(cont):
            context = cont[:k]
            if context not in index:
                index[context] = len(index)
            own.append((index[context], int(token)))
        steps.append(tuple(own))
    return ContinuationRead(tuple(conts), tuple(index), tuple(steps))


def sum_logprobs(
    read: ContinuationRead, rows: Sequence[tuple[dict[int, float], float]]
) -> np.ndarray:
    """Each option's summed log-probability from its contexts' rows (per context: the logits
    read, by token, and the full-vocabulary logsumexp there)."""
    out = np.zeros(len(read.conts))
    for i, steps in enumerate(read.steps):
        total = 0.0
        for context, token in steps:
            logits, logsumexp = rows[context]
            total += float(logits[token]) - logsumexp
        out[i] = total
    return out


def normalise(sums: np.ndarray, read: ContinuationRead, normalization: str) -> np.ndarray:
    """sum: as is; mean: per token; pmi: the sums (the content-free sums are taken off later,
    bias.py)."""
    if normalization == "mean":
        return sums / np.asarray([len(c) for c in read.conts], np.float64)
    return sums
