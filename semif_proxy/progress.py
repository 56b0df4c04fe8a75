"""Progress of long work, one implementation for every command: tqdm bars and status lines on
stderr, drawn only when stderr is a terminal so that CI logs and pipes stay readable (the same
work then logs nothing more than its result)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def interactive(stream: IO[str] | None = None) -> bool:
    stream = stream or sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


def bar(total: float | None = None, desc: str = "", unit: str = "it", **kwargs: Any) -> tqdm:
    """A bar on stderr (bytes: unit="B"); disabled off a terminal."""
    scaled = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        disable=not interactive(),
        dynamic_ncols=True,
        **scaled,
        **kwargs,
    )


def track(items: Iterable[T], total: int | None = None, desc: str = "") -> Iterator[T]:
    with bar(total=total, desc=desc) as shown:
        for item in items:
            yield item
            shown.update(1)


class Status:
    """A long wait's status line: what it waits for, then each change of state with the time
    elapsed. Always written (a wait of an hour must say what it waits for even in a CI log),
    one line per change."""

    def __init__(self, what: str, stream: IO[str] | None = None) -> None:
        self.what = what
        self.stream = stream or sys.stderr
        self.start = time.monotonic()
        self.last: str | None = None

    def elapsed(self) -> str:
        seconds = int(time.monotonic() - self.start)
        return f"{seconds // 60}m{seconds % 60:02d}s"

    def update(self, state: str) -> None:
        if state != self.last:
            self.last = state
            self.stream.write(f"{self.what}: {state} ({self.elapsed()})\n")
            self.stream.flush()


def note(text: str, stream: IO[str] | None = None) -> None:
    """One line that is not a bar: what a long wait is about to wait for (the name of what was
    started, where its log is). Always written, like Status lines."""
    stream = stream or sys.stderr
    stream.write(text + "\n")
    stream.flush()


class Reading:
    """A binary file whose reads advance a bytes bar: for work that pulls a file through read()
    (hashing, tarfile.addfile)."""

    def __init__(self, raw: IO[bytes], shown: tqdm) -> None:
        self.raw = raw
        self.shown = shown

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.shown.update(len(data))
        return data
