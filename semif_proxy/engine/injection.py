"""The injection policy: no request text may hold one of the model's special tokens.

Prompts are tokenized the way llama-server tokenizes them, with special tokens parsed, so a
`<|im_start|>` inside a state or an option would be read as the chat template's own marker and
could rewrite the conversation the model sees. Such text is refused, with the field that holds
it. Pure: the worker gives the special tokens' texts, callers give the values and their paths.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from semif_proxy.errors import InvalidRequest


def walk_strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every string in a JSON value (keys too) with its field path; a stack, not recursion, so
    a deeply nested value cannot exhaust Python's recursion limit."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            yield where, item
        elif isinstance(item, dict):
            for k, v in reversed(list(item.items())):
                stack.append((v, f"{where}.{k}"))
                stack.append((str(k), where))
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(item))))


class SpecialTokenPolicy:
    """Refuses any string that contains the text of one of the given special tokens."""

    def __init__(self, special_texts: Iterable[str]) -> None:
        texts = {t for t in special_texts if t.strip()}
        # Longest first, so the error names the whole token and not a shorter one inside it.
        ordered = sorted(texts, key=len, reverse=True)
        self.pattern = re.compile("|".join(re.escape(t) for t in ordered)) if ordered else None

    def check(self, value: Any, path: str) -> None:
        """Raise InvalidRequest naming the first string in `value` (walked in document order)
        that holds a special token."""
        if self.pattern is None:
            return
        for where, text in walk_strings(value, path):
            found = self.pattern.search(text)
            if found:
                raise InvalidRequest(
                    f"{where}: contains {found.group(0)!r}, a special token of the model; "
                    "template tokens are not allowed in requests",
                    field=where,
                )
