"""Options labelled with several tokens, scored as label sequences.

A label's probability is the product of its tokens' next-token probabilities after the prompt.
Where one label's tokens are a prefix of another's ("1" and "12" with a digit-by-digit
tokenizer), the answer-ending token (end of turn) is scored after the shorter one: "1" then
means "1, end", and the scored sequences form a prefix-free set, so their probabilities are a
proper share of the model's distribution (they sum to at most 1) and renormalising them over
the options is a distribution over the options.

The sequences are scored through a tree: every distinct proper prefix of a sequence is a node,
decoded once (engine.cpp score_tree); each sequence's tokens are read from the rows of its
prefixes. Pure: no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Tokens = tuple[int, ...]


class LabelError(ValueError):
    pass


@dataclass(frozen=True)
class LabelTree:
    sequences: tuple[Tokens, ...]  # per option: its label's tokens (+ the end token if needed)
    tokens: list[int]  # node i's token
    parent: list[int]  # node i's parent node, -1 for the first token after the prompt
    ids: list[list[int]]  # tokens read at node i
    root_ids: list[int]  # tokens read at the prompt's last position
    steps: tuple[tuple[tuple[int, int], ...], ...]  # per option: (node or -1, index in its ids)

    @property
    def nodes(self) -> int:
        return len(self.tokens)

    def logprobs(
        self,
        root_logits: np.ndarray,
        root_logsumexp: float,
        node_logits: Sequence[np.ndarray],
        node_logsumexp: Sequence[float],
    ) -> np.ndarray:
        """Each option's sequence log-probability from the engine's rows."""
        out = np.zeros(len(self.sequences))
        for i, steps in enumerate(self.steps):
            total = 0.0
            for node, index in steps:
                if node < 0:
                    total += float(root_logits[index]) - root_logsumexp
                else:
                    total += float(node_logits[node][index]) - float(node_logsumexp[node])
            out[i] = total
        return out

    def first_token_index(self, option: int) -> int:
        """Where the option's first token sits in root_ids."""
        return self.steps[option][0][1]


def build(labels: Sequence[Sequence[int]], end: int) -> LabelTree:
    """The tree that scores these label token sequences (one per option)."""
    plain = [tuple(int(t) for t in label) for label in labels]
    if any(not label for label in plain):
        raise LabelError("every label needs at least one token")
    if len(set(plain)) != len(plain):
        raise LabelError("two labels have the same tokens")
    prefixes = {label[:k] for label in plain for k in range(1, len(label))}
    sequences = tuple((*label, end) if label in prefixes else label for label in plain)
    # Contexts: every proper prefix of a sequence, shortest first, so parents precede children.
    contexts = sorted(
        {seq[:k] for seq in sequences for k in range(1, len(seq))}, key=lambda c: (len(c), c)
    )
    index = {c: i for i, c in enumerate(contexts)}
    wanted: dict[Tokens, list[int]] = {(): []}
    for c in contexts:
        wanted[c] = []
    for seq in sequences:
        for k in range(len(seq)):
            ids = wanted[seq[:k]]
            if seq[k] not in ids:
                ids.append(seq[k])
    steps = tuple(
        tuple((index[seq[:k]] if k else -1, wanted[seq[:k]].index(seq[k])) for k in range(len(seq)))
        for seq in sequences
    )
    return LabelTree(
        sequences=sequences,
        tokens=[c[-1] for c in contexts],
        parent=[index[c[:-1]] if len(c) > 1 else -1 for c in contexts],
        ids=[wanted[c] for c in contexts],
        root_ids=wanted[()],
        steps=steps,
    )


class Trees:
    """The tree of each option count of one numbering (the first n labels' tokens, the end
    token), built the first time that count is asked: questions repeat their option counts,
    and a 255-option tree takes a few milliseconds to build."""

    def __init__(self, labels: Sequence[Sequence[int]], end: int) -> None:
        self._labels = [tuple(int(t) for t in label) for label in labels]
        self._end = end
        self._built: dict[int, LabelTree] = {}

    def for_count(self, n: int) -> LabelTree:
        if n not in self._built:
            self._built[n] = build(self._labels[:n], self._end)
        return self._built[n]
