"""The direct readout's numbers (issue #35): a yes/no or score question read from the model's
own answer words after a prompt that asks for them, not from option letters.

An answer word is spelled several ways in a vocabulary ("yes", "Yes", " yes", ...); each
spelling that is one token is read at the prompt's last position and their probabilities are
summed: log P(word) = logsumexp(logits of its tokens) - logsumexp(all logits). A word none of
whose spellings is one token cannot be read this way (the request is refused). Pure: no engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def spellings(word: str) -> tuple[str, ...]:
    """The ways an answer word starts an answer: as written, capitalised, upper case, each with
    and without a leading space (numbers: with and without the space)."""
    forms = dict.fromkeys([word, word.capitalize(), word.upper(), word.lower()])
    return tuple(f for form in forms for f in (form, " " + form))


def word_tokens(word: str, tokenize_text: Callable[[str], list[int]]) -> tuple[int, ...]:
    """The single-token spellings of a word, each token once."""
    tokens: dict[int, None] = {}
    for spelling in spellings(word):
        ids = tokenize_text(spelling)
        if len(ids) == 1:
            tokens[int(ids[0])] = None
    return tuple(tokens)


def shared(word_ids: Sequence[Sequence[int]]) -> tuple[int, ...] | None:
    """A token two answer words share (then they cannot be told apart), or None."""
    seen: set[int] = set()
    for ids in word_ids:
        both = seen.intersection(ids)
        if both:
            return tuple(sorted(both))
        seen.update(ids)
    return None


def word_logprobs(
    logits: dict[int, float], logsumexp: float, words: Sequence[Sequence[int]]
) -> np.ndarray:
    """Each option's log P(answer word) from the logits read at the prompt's end (by token)."""
    out = np.zeros(len(words))
    for i, tokens in enumerate(words):
        values = np.asarray([logits[int(t)] for t in tokens], np.float64)
        out[i] = float(np.logaddexp.reduce(values)) - logsumexp
    return out
