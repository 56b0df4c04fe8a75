"""Asking rows of targets for long runs: `concurrency` rows at once per target, 429/503 retried
within a bounded budget, each answer appended to a rows file as it comes so that an
interrupted run keeps it and a resumed one asks only the rest."""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from semif_proxy.eval.metrics import scored
from semif_proxy.eval.rows import Row
from semif_proxy.eval.targets import Answer, Failure, Target
from semif_proxy.progress import bar as progress_bar

RETRY_STATUSES = frozenset({429, 503})
RETRY_TRIES = 5
RETRY_BUDGET = 30.0
RETRY_FIRST_WAIT = 0.5
RETRY_MAX_WAIT = 8.0


@dataclass(frozen=True)
class Retries:
    tries: int = RETRY_TRIES
    budget: float = RETRY_BUDGET
    first_wait: float = RETRY_FIRST_WAIT
    max_wait: float = RETRY_MAX_WAIT

    def wait(self, tried: int, failure: Failure) -> float:
        backoff = min(self.max_wait, self.first_wait * 2 ** (tried - 1))
        backoff *= 1.0 + 0.2 * random.random()
        return max(backoff, failure.retry_after or 0.0)


class Interrupted(Exception):
    """The run stopped (Ctrl-C): the asks still waiting give up."""


# After a 429/503 a target is asked fewer rows at once; one more after this long without one.
LIMIT_QUIET = 10.0


class Limiter:
    """How many rows are asked of one target at once: `most` (--concurrency) to start with,
    halved at every 429/503 (down to one), one more after LIMIT_QUIET seconds without one.
    Rows wait for their turn in the order they came (a row that was refused comes back after
    its wait, behind the rows already waiting). So a server that admits fewer requests at once
    than --concurrency gets them one after another instead of refusing most of them, and a
    refused row's retry, after a wait shorter than LIMIT_QUIET (as the backoff's are, and most
    Retry-Afters), does not meet more rows of this run than the one before it."""

    def __init__(self, most: int, stop: threading.Event) -> None:
        self.most = most
        self.limit = most
        self.running = 0
        self.refused_at = 0.0
        self.stop = stop
        self._cond = threading.Condition()
        self._next = 0
        self._turn = 0

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        with self._cond:
            ticket = self._next
            self._next += 1
            self._cond.wait_for(
                lambda: self.stop.is_set() or (self._turn == ticket and self.running < self.limit)
            )
            if self.stop.is_set():
                raise Interrupted
            self._turn += 1
            self.running += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self.running -= 1
                self._cond.notify_all()

    def refused(self) -> None:
        with self._cond:
            self.limit = max(1, self.limit // 2)
            self.refused_at = time.monotonic()

    def answered_one(self) -> None:
        with self._cond:
            now = time.monotonic()
            if self.limit < self.most and now - self.refused_at >= LIMIT_QUIET:
                self.limit += 1
                self.refused_at = now  # the next step up after as long again
                self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


def ask_one(
    target: Target, row: Row, limiter: Limiter, retries: Retries
) -> tuple[Answer | Failure, int]:
    """One row asked of one target, retried on 429/503 as RETRY_* say: the last answer or
    failure and the tries it took."""
    waited = 0.0
    tried = 0
    while True:
        with limiter.slot():
            got = target.ask(row.route, row.body)
        tried += 1
        if isinstance(got, Answer) or got.status not in RETRY_STATUSES:
            limiter.answered_one()
            return got, tried
        limiter.refused()
        if tried >= retries.tries:
            return got, tried
        wait = retries.wait(tried, got)
        if waited + wait > retries.budget:
            return got, tried
        if limiter.stop.wait(wait):
            raise Interrupted
        waited += wait


def row_digest(row: Row) -> str:
    """What identifies a row's question in the rows file: a resumed run reuses an answer only
    for the same request and label at the same line."""
    text = json.dumps([row.route, row.body, row.expected], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def rows_log_path(out: Path) -> Path:
    """Where `semif-proxy eval --out X` appends its answers as they come: X.rows.jsonl."""
    return out.with_name(out.name + ".rows.jsonl")


@dataclass
class Kept:
    """What a resumed run found in the rows file."""

    answers: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)
    unreadable: int = 0  # lines that are not a record (one cut short when the run was killed)
    stale: int = 0  # records of another row at that line, or of a target not asked now


def read_kept(path: Path, rows: Sequence[Row], targets: Sequence[Target]) -> Kept:
    """The answers already in the rows file, by (line, target): only those of the same row at
    the same line, asked of a target of this run, and answered (a failure is asked again)."""
    kept = Kept()
    if not path.is_file():
        return kept
    digests = {row.line: row_digest(row) for row in rows}
    names = {t.name for t in targets}
    with path.open(encoding="utf-8", errors="replace") as f:
        for text in f:
            if not text.strip():
                continue
            try:
                record = json.loads(text)
                key = (int(record["line"]), str(record["target"]))
                digest, answer = record["row"], record["answer"]
            except (ValueError, KeyError, TypeError):
                kept.unreadable += 1
                continue
            if digests.get(key[0]) != digest or key[1] not in names or not isinstance(answer, dict):
                kept.stale += 1
            elif "predicted" in answer:
                kept.answers[key] = answer
    return kept


def open_rows_log(path: Path, resume: bool) -> IO[str]:
    """The rows file, appended to when resuming (after the end of a line cut short), else
    started afresh."""
    if not resume or not path.exists():
        return path.open("w", encoding="utf-8")
    cut = False
    with path.open("rb") as f:
        if f.seek(0, 2) > 0:
            f.seek(-1, 2)
            cut = f.read(1) != b"\n"
    out = path.open("a", encoding="utf-8")
    if cut:
        out.write("\n")
    return out


@dataclass
class Asked:
    """Every (row line, target name) answer of a run, as the results list it."""

    answers: dict[tuple[int, str], dict[str, Any]]
    resumed: int = 0
    retried: int = 0  # tries after the first, over every row


def _entry(row: Row, got: Answer | Failure, tries: int) -> dict[str, Any]:
    entry = scored(row, got) if isinstance(got, Answer) else got.as_dict()
    entry["tries"] = tries
    return entry


def ask_all(
    rows: Sequence[Row],
    targets: Sequence[Target],
    *,
    concurrency: int = 1,
    kept: dict[tuple[int, str], dict[str, Any]] | None = None,
    log: IO[str] | None = None,
    retries: Retries | None = None,
    progress: bool = True,
) -> Asked:
    """Every row asked of every target (`concurrency` rows at once per target), except those
    in `kept`; each answer appended to `log` as it comes. On an interruption (Ctrl-C) the asks
    in progress are stopped and the exception goes on: what `log` holds is kept."""
    answers = dict(kept or {})
    asked = Asked(answers, resumed=len(answers))
    retries = retries or Retries()
    stop = threading.Event()
    limiters = [Limiter(concurrency, stop) for _ in targets]
    pools = [
        ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=f"eval-{i}")
        for i, _ in enumerate(targets)
    ]
    futures: dict[Future[tuple[Answer | Failure, int]], tuple[Row, Target]] = {}
    for row in rows:
        for target, limiter, pool in zip(targets, limiters, pools):
            if (row.line, target.name) not in answers:
                futures[pool.submit(ask_one, target, row, limiter, retries)] = (row, target)
    shown = (
        progress_bar(total=len(rows) * len(targets), desc="eval", unit="ask", initial=len(answers))
        if progress and rows
        else None
    )
    failed = 0
    try:
        for future in as_completed(futures):
            row, target = futures[future]
            got, tries = future.result()
            entry = _entry(row, got, tries)
            answers[(row.line, target.name)] = entry
            asked.retried += tries - 1
            failed += isinstance(got, Failure)
            if log is not None:
                record = {
                    "line": row.line,
                    "id": row.id,
                    "target": target.name,
                    "row": row_digest(row),
                    "answer": entry,
                }
                log.write(json.dumps(record, ensure_ascii=False) + "\n")
                log.flush()
            if shown is not None:
                shown.set_postfix(retries=asked.retried, failed=failed, refresh=False)
                shown.update(1)
    except BaseException:
        stop.set()
        for limiter in limiters:
            limiter.wake()
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)
        for target in targets:
            target.interrupt()
        raise
    finally:
        for pool in pools:
            pool.shutdown(wait=True)
        if shown is not None:
            shown.close()
    return asked


# -- scoring ----------------------------------------------------------------------------------
