"""The rows log (SEMIF_ROWS_LOG): one JSON line per question the server answered, with the
option logits of every order it was asked in, for `semif-proxy calibrate --rows` to fit the
position prior from (questions asked with `permutations: n` are the ones it can use). The
line format lives here both ways: written by the server (`question_line`), read back for
`semif-proxy calibrate --rows` (`read_rows`).

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

import numpy as np

from semif_proxy.calibration.position_prior import RotatedRow, RowsError
from semif_proxy.calibration.question_types import QUESTION_TYPES
from semif_proxy.engine.prompt import prompt_sha256
from semif_proxy.jsonl_files import json_objects

if TYPE_CHECKING:
    from semif_proxy.engine.questions import Scored

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
        "prompt_version": runs[0].prompt_version,
        "position_prior": runs[0].question.position_prior,
        # A contextually corrected question (yes/no by default) is served from z - z_cf: the
        # content-free logits of each order, divided out when the log is read for calibration.
        **(
            {"content_free_logits": [[float(v) for v in s.content_free_logits] for s in runs]}
            if all(s.content_free_logits is not None for s in runs)
            else {}
        ),
    }


def parse_row(line: dict[str, Any], where: str) -> RotatedRow | None:
    """A line of the rows log (SEMIF_ROWS_LOG): {type, orders, option_logits, ...}; None for a
    one-option question (older logs hold them), which carries no position information."""
    kind = str(line.get("type", "decision"))
    if kind not in QUESTION_TYPES:
        raise RowsError(f"{where}: type {kind!r} is not one of {QUESTION_TYPES}")
    orders = line.get("orders")
    logits = line.get("option_logits")
    if not isinstance(orders, list) or not isinstance(logits, list) or not logits:
        raise RowsError(f"{where}: needs `orders` and `option_logits` (one list per order)")
    try:
        array = np.asarray(logits, dtype=np.float64)
    except (TypeError, ValueError):
        raise RowsError(f"{where}: option_logits must be lists of numbers") from None
    if array.ndim == 2 and array.shape[1] == 1 and all(o == [0] for o in orders):
        return None  # one option: answered without the model, nothing about positions in it
    if array.ndim != 2 or array.shape[1] < 2 or len(orders) != array.shape[0]:
        raise RowsError(
            f"{where}: option_logits must be one list of at least 2 numbers per order "
            f"({len(orders)} orders)"
        )
    if not np.isfinite(array).all():
        raise RowsError(f"{where}: option_logits must be finite")
    free = line.get("content_free_logits")
    if free is not None:
        try:
            free_array = np.asarray(free, dtype=np.float64)
        except (TypeError, ValueError):
            raise RowsError(f"{where}: content_free_logits must be lists of numbers") from None
        if free_array.shape != array.shape or not np.isfinite(free_array).all():
            raise RowsError(f"{where}: content_free_logits must match option_logits")
        array = array - free_array  # what was served: the content-free answer divided out
    if not all(isinstance(o, list) and all(isinstance(i, int) for i in o) for o in orders):
        raise RowsError(f"{where}: orders must be lists of option indices")
    model = line.get("model")
    version = line.get("prompt_version")
    return RotatedRow(
        kind,
        orders,
        array,
        str(model) if model is not None else None,
        str(version) if version is not None else None,
    )


def read_rows(path: Path) -> list[RotatedRow]:
    out = []
    for where, line in json_objects(path, RowsError):
        row = parse_row(line, where)
        if row is not None:
            out.append(row)
    if not out:
        raise RowsError(f"{path}: no rows")
    models = sorted({r.model for r in out if r.model is not None})
    if len(models) > 1:
        raise RowsError(
            f"{path}: rows of {len(models)} models ({', '.join(models)}); a prior belongs to "
            "one model: fit each model's rows on their own"
        )
    return out
