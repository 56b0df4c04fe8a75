"""JSON Lines files read line by line (the rows log, labelled predictions), every error naming
its file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def json_objects(path: Path, error: type[ValueError]) -> Iterator[tuple[str, dict[str, Any]]]:
    """A JSON Lines file's objects with where each one is ("file:line"); blank lines skipped,
    anything else that is not a JSON object raised as `error` naming its line."""
    with path.open(encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{number}: not JSON: {exc}") from None
            if not isinstance(line, dict):
                raise error(f"{path}:{number}: not a JSON object")
            yield f"{path}:{number}", line


__all__ = ["json_objects"]
