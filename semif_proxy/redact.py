"""Secrets never reach the logs: by flag name in argv lists, by value everywhere else.

`register()` is given the secret values once, at start-up (settings.load_settings); the JSON log
formatter (logs.py) then masks every occurrence of them in every line, whatever logged it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence

MASK = "***"
# A variable or flag whose name says it holds a secret.
SECRET_NAME = re.compile(r"key|token|secret|password", re.IGNORECASE)
# Shorter values are not masked by value (they would blank ordinary words and numbers); flags
# and settings still mask them by name.
MIN_LENGTH = 4
_NOT_SECRET = frozenset({"true", "false", "on", "off", "yes", "no", "auto", "none", "null"})

_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def _maskable(value: str) -> bool:
    text = value.strip()
    if len(text) < MIN_LENGTH or text.lower() in _NOT_SECRET:
        return False
    try:
        float(text)
    except ValueError:
        return True
    return False  # a number (a token limit, say) is no secret


def secret_values(env: Mapping[str, str], api_key: str | None, prefix: str) -> list[str]:
    """The API key and the value of every `<prefix>*` variable whose name says it is secret."""
    values = [api_key] if api_key else []
    values += [v for k, v in env.items() if k.startswith(prefix) and SECRET_NAME.search(k)]
    return values


def register(values: Iterable[str]) -> None:
    """Mask these values (and their JSON-escaped spellings) in every log line from now on."""
    global _pattern
    for value in values:
        if not _maskable(value):
            continue
        for text in {value, value.strip()}:
            _secrets.add(text)
            _secrets.add(json.dumps(text)[1:-1])  # as it appears inside a JSON string
            _secrets.add(json.dumps(text, ensure_ascii=False)[1:-1])
    if _secrets:
        ordered = sorted(_secrets, key=len, reverse=True)  # longest first: no partial leftovers
        _pattern = re.compile("|".join(re.escape(s) for s in ordered))


def redact_text(text: str) -> str:
    return _pattern.sub(MASK, text) if _pattern is not None else text


def redact_argv(argv: Sequence[str]) -> list[str]:
    """argv with the value of every key/token/secret/password-like flag masked:
    `--api-key K` -> `--api-key ***`, `--hf-token=T` -> `--hf-token=***`."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        name, eq, _ = arg.partition("=")
        is_flag = arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit()
        if is_flag and SECRET_NAME.search(name):
            if eq:
                out.append(f"{name}={MASK}")
            else:
                out.append(arg)
                # A `--no-...` form is a switch: nothing follows it.
                mask_next = not name.lstrip("-").startswith("no-")
            continue
        out.append(arg)
    return out
