"""The rows log (SEMIF_ROWS_LOG): one JSON line per question the server answered, with the
option logits of every order it was asked in, for `semif-proxy calibrate --rows` to fit the
position prior from (questions asked with `permutations: n` are the ones it can use).

Lines go through a bounded queue to one writer thread: the engine thread only hands over a dict
and never waits on the disk. A line that cannot be written (the disk is full, the file went
away) is dropped and the request still answered; the first such error is logged, once.
"""

from __future__ import annotations

import atexit
import json
import logging
import queue
import threading
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semif_proxy.prompt import prompt_sha256

if TYPE_CHECKING:
    from semif_proxy.engine import Scored

log = logging.getLogger("semif_proxy.rows_log")
# Lines waiting for the writer; beyond it new lines are dropped (counted, logged once).
MAX_PENDING = 10_000


class RowsLog:
    def __init__(self, path: Path, max_pending: int = MAX_PENDING) -> None:
        self.path = path
        self.written = 0
        self.dropped = 0
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(max_pending)
        self._reported = False
        self._closed = False
        self._thread = threading.Thread(target=self._drain, name="semif-rows-log", daemon=True)
        self._thread.start()

    def record(self, lines: Iterable[dict[str, Any]]) -> None:
        """Hand lines to the writer; never blocks, never raises."""
        for line in lines:
            try:
                self._queue.put_nowait(line)
            except queue.Full:
                self.dropped += 1
                self._report("the rows log is behind; lines dropped", None)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every line handed over so far is written (or dropped)."""
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (self._queue.join(), done.set()), daemon=True)
        waiter.start()
        return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _report(self, message: str, error: OSError | None) -> None:
        if self._reported:
            return
        self._reported = True
        log.error(
            message,
            extra={
                "event": "rows_log_error",
                "path": str(self.path),
                "error": str(error) if error else None,
            },
        )

    def _drain(self) -> None:
        handle = None
        while True:
            line = self._queue.get()
            try:
                if line is None:
                    return
                text = json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"
                try:
                    if handle is None:
                        handle = self.path.open("a", encoding="utf-8")
                    handle.write(text)
                    # One line a write, flushed: a reader (or a crash) sees whole lines.
                    handle.flush()
                    self.written += 1
                except OSError as exc:
                    self.dropped += 1
                    self._report("the rows log cannot be written; lines dropped", exc)
                    if handle is not None:
                        handle.close()
                    handle = None  # reopened for the next line: the disk may recover
            finally:
                self._queue.task_done()
                if line is None and handle is not None:
                    handle.close()


_logs: dict[Path, RowsLog] = {}
_lock = threading.Lock()


def get(path: Path) -> RowsLog:
    """The one writer for this path in this process."""
    with _lock:
        if path not in _logs:
            _logs[path] = RowsLog(path)
        return _logs[path]


def record(path: Path | None, lines: Iterable[dict[str, Any]]) -> None:
    """Append lines to the rows log at path; nothing when there is none (the default)."""
    if path is not None:
        get(path).record(lines)


@atexit.register
def _close_all() -> None:
    with _lock:
        logs = list(_logs.values())
    for rows in logs:
        rows.close()


def question_line(
    model: dict[str, Any],
    api: str,
    kind: str,
    qid: str,
    option_ids: Sequence[str],
    orders: list[list[int]],
    runs: Sequence[Scored],
) -> dict[str, Any]:
    """One question as the rows log holds it: each order's option logits in presented order
    (position j of orders[r] lists option orders[r][j]), raw (before any prior or temperature).
    No state or question text: the prompt's sha256 (of the request's own order) joins a line
    to labels kept elsewhere."""
    return {
        "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "model": model["sha256"],
        "api": api,
        "type": kind,
        "id": qid,
        "option_ids": list(option_ids),
        "orders": orders,
        "option_logits": [[float(v) for v in s.option_logits] for s in runs],
        "prompt_sha256": prompt_sha256(runs[0].prompt),
        "position_prior": "applied" if runs[0].question.log_position_prior else "none",
    }
