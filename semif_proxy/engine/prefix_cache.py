"""Evaluated state prefixes kept across requests: an LRU of KV snapshots bounded in bytes."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def tokens_key(tokens: Sequence[int]) -> str:
    return hashlib.sha256(array("i", tokens).tobytes()).hexdigest()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    stores: int = 0
    evictions: int = 0


class PrefixCache:
    """Maps the hash of a prefix's tokens to the serialized KV state of that prefix and the
    logits at its last position (kept so a restored prefix needs no re-evaluation at all; empty
    when the prefix was evaluated together with its first question, see Engine::ensure_prefix).

    Not thread-safe on purpose: only the engine's single worker thread touches it.
    """

    def __init__(self, max_bytes: int, min_tokens: int = 32) -> None:
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self.stats = CacheStats()
        self._items: OrderedDict[str, tuple[tuple[int, ...], bytes, np.ndarray]] = OrderedDict()
        self._bytes = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def worth_caching(self, tokens: Sequence[int]) -> bool:
        return self.enabled and len(tokens) >= self.min_tokens

    def get(self, tokens: Sequence[int]) -> tuple[bytes, np.ndarray] | None:
        key = tokens_key(tokens)
        item = self._items.get(key)
        if item is None or item[0] != tuple(tokens):
            self.stats.misses += 1
            return None
        self._items.move_to_end(key)
        self.stats.hits += 1
        return item[1], item[2]

    @staticmethod
    def _size(state: bytes, logits: np.ndarray) -> int:
        return len(state) + int(logits.nbytes)

    def clear(self) -> None:
        """Drop every held prefix (the statistics stay): a benchmark's cold start."""
        self._items.clear()
        self._bytes = 0

    def put(self, tokens: Sequence[int], state: bytes, logits: np.ndarray) -> None:
        size = self._size(state, logits)
        if size > self.max_bytes:
            return
        key = tokens_key(tokens)
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= self._size(old[1], old[2])
        self._items[key] = (tuple(tokens), state, logits)
        self._bytes += size
        self.stats.stores += 1
        while self._bytes > self.max_bytes:
            _, (_, dropped, dropped_logits) = self._items.popitem(last=False)
            self._bytes -= self._size(dropped, dropped_logits)
            self.stats.evictions += 1
