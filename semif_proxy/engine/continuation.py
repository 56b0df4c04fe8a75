"""The continuation readout's plan and numbers (issue #35): each option's own text scored as
the answer after the prompt.

An option's log-probability is the sum, over its tokens, of each token's log-probability after
the prompt and the option's tokens before it. The engine evaluates prompt + option (its last
token left off: nothing reads what follows it) as it evaluates a lettered prompt, after the
shared state on sequence 0, and reads the rows at the option's positions: the prompt's last
one predicts the option's first token, the option's k-th its (k+1)-th. Its numbers are those
of prompt + option evaluated in one piece with those rows read (the exactness guarantee;
language-model evaluation suites score a continuation this way). One branch per option: its
cost is the option's tokens, not one evaluation per token. Pure: no engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Tokens = tuple[int, ...]


@dataclass(frozen=True)
class ContinuationRead:
    """One question's continuations: per option, its answer tokens. Option i is evaluated as
    the prompt's tail + conts[i][:-1] with rows at its last len(conts[i]) positions."""

    conts: tuple[Tokens, ...]

    @property
    def targets(self) -> list[int]:
        return sorted({t for cont in self.conts for t in cont})

    def heads(self) -> list[list[int]]:
        """What each option adds to the prompt: its tokens but the last."""
        return [list(c[:-1]) for c in self.conts]

    def rows(self) -> list[int]:
        """Rows read per option: one per token."""
        return [len(c) for c in self.conts]

    def extra_tokens(self) -> int:
        """Tokens the options add after the prompt (each option evaluated on its own)."""
        return sum(len(c) - 1 for c in self.conts)

    def longest(self) -> int:
        return max(len(c) for c in self.conts)


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
    if any(not c for c in conts):
        raise ValueError("a continuation must hold a token")
    return ContinuationRead(tuple(tuple(int(t) for t in c) for c in conts))


def sum_logprobs(
    read: ContinuationRead, rows: Sequence[Sequence[tuple[dict[int, float], float]]]
) -> np.ndarray:
    """Each option's summed log-probability from its rows (per option, one per token: the
    logits read, by token, and the full-vocabulary logsumexp at the position before it)."""
    out = np.zeros(len(read.conts))
    for i, (cont, own) in enumerate(zip(read.conts, rows)):
        assert len(own) == len(cont), (len(own), len(cont))
        total = 0.0
        for token, (logits, logsumexp) in zip(cont, own):
            total += float(logits[token]) - logsumexp
        out[i] = total
    return out


def normalise(sums: np.ndarray, read: ContinuationRead, normalization: str) -> np.ndarray:
    """sum: as is; mean: per token; pmi: the sums (the content-free sums are taken off later,
    bias.py)."""
    if normalization == "mean":
        return sums / np.asarray([len(c) for c in read.conts], np.float64)
    return sums
