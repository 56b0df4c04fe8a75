"""`semif-proxy eval`: labelled rows asked of one or more targets, scored side by side.

A row is a JevBench row (`state`, `question`, `expected`: a System One question) or a labelled
decision (`{"decision": {...}, "expected": "<option id>"}`). Every valid row is asked of every
target (targets.py); each target gets accuracy, balanced accuracy, ECE, a reliability
table, the confusion of its most frequent labels, latency and tokens, and the rows on which the
targets' argmax labels differ are listed. A row that cannot be asked (not JSON, no `expected`,
a label the question does not have) is reported and skipped; a row a target fails is that
target's error on that row. Neither stops the run.

For long runs: `concurrency` rows are asked of each target at once; a 429 or 503 is retried
(RETRY_* below); each answer is appended, as it comes, to a rows file (JSON Lines, one record
per row and target), so that a run that is interrupted keeps them and a resumed run asks only
the rest (docs/eval.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from semif_proxy.calibration.temperature import ece
from semif_proxy.errors import ApiError
from semif_proxy.eval.jevbench import Task
from semif_proxy.eval.targets import Answer, Failure, Target
from semif_proxy.progress import bar as progress_bar

BINS = 10
# The confusion table keeps the most frequent labels; the rest are counted as OTHER.
CONFUSION_LABELS = 8
OTHER = "(other)"


@dataclass(frozen=True)
class Row:
    """One labelled question, ready to send: `route` names the API its `body` is for."""

    line: int
    id: str
    kind: str  # decision, noul, choice or score
    route: str  # "systemone" or "decisions"
    body: dict[str, Any]
    expected: str
    labels: tuple[str, ...]


@dataclass(frozen=True)
class BadRow:
    line: int
    id: str | None
    error: str


class RowError(ValueError):
    pass


def _api_message(exc: ApiError) -> str:
    detail = getattr(exc, "detail", None)
    if detail:
        first = detail[0]
        where = ".".join(str(p) for p in first.get("loc", []) if p != "body")
        return f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
    return exc.message


def _systemone_row(line: int, row: dict[str, Any], path: Path) -> Row:
    from semif_proxy.api import systemone

    task = Task(path.stem, row)
    body = task.request()
    try:
        systemone.parse_request(body)
    except ApiError as exc:
        raise RowError(_api_message(exc)) from None
    question = row["question"]
    if question["type"] == "noul":
        labels: tuple[str, ...] = ("yes", "no")  # label_probabilities' names for true/false
    elif question["type"] == "choice":
        labels = tuple(question["criteria"])
    else:
        labels = tuple(str(i) for i in range(len(question["criteria"])))
    return Row(line, task.id, task.kind, "systemone", body, task.expected, labels)


def _decision_row(line: int, row: dict[str, Any]) -> Row:
    from semif_proxy.api import decisions

    body = {"decision": row["decision"]}
    try:
        parsed = decisions.parse_request(body)
    except ApiError as exc:
        raise RowError(_api_message(exc)) from None
    decision = parsed.decisions[0]
    labels = tuple(o.id for o in decision.options)
    return Row(line, decision.id, "decision", "decisions", body, str(row["expected"]), labels)


def parse_row(line: int, row: Any, path: Path) -> Row:
    """A row as a request and its label; RowError says what is wrong with it."""
    if not isinstance(row, dict):
        raise RowError("a row is a JSON object")
    if "expected" not in row or row["expected"] is None:
        raise RowError("expected: missing (the label the row should get)")
    if "decision" in row:
        parsed = _decision_row(line, row)
    elif "question" in row and "state" in row:
        if "id" not in row:
            row = {**row, "id": f"line-{line}"}
        parsed = _systemone_row(line, row, path)
    else:
        raise RowError(
            "neither a labelled decision ({decision, expected}) nor a System One question "
            "({state, question, expected}, the JevBench row)"
        )
    if parsed.expected not in parsed.labels:
        raise RowError(
            f"expected: {parsed.expected!r} is not one of the question's labels "
            f"{list(parsed.labels)}"
        )
    return parsed


def read_rows(path: Path, limit: int | None = None) -> tuple[list[Row], list[BadRow]]:
    rows: list[Row] = []
    bad: list[BadRow] = []
    with path.open(encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            if limit is not None and len(rows) + len(bad) >= limit:
                break
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                bad.append(BadRow(number, None, f"not JSON: {exc}"))
                continue
            row_id = data.get("id") if isinstance(data, dict) else None
            if row_id is None and isinstance(data, dict) and isinstance(data.get("decision"), dict):
                row_id = data["decision"].get("id")
            try:
                rows.append(parse_row(number, data, path))
            except RowError as exc:
                bad.append(BadRow(number, None if row_id is None else str(row_id), str(exc)))
    return rows, bad


# -- asking -----------------------------------------------------------------------------------


# Retries of a 429 or 503 (a server whose queue is full, a throttled endpoint, a llama-server
# restarting): at most RETRY_TRIES tries of one row on one target. Between tries it waits the
# target's Retry-After, or longer: the backoff, RETRY_FIRST_WAIT doubled at each try up to
# RETRY_MAX_WAIT, plus up to a fifth at random. One row's waits add up to at most
# RETRY_BUDGET seconds; a wait that would pass it ends the retries, and the row keeps the last
# failure (with its `tries`).
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


def scored(row: Row, answer: Answer) -> dict[str, Any]:
    predicted = answer.predicted
    return {
        "predicted": predicted,
        "probability": answer.probabilities[predicted],
        "correct": predicted == row.expected,
        "probabilities": answer.probabilities,
        "input_tokens": answer.input_tokens,
        "seconds": answer.seconds,
    }


def balanced_accuracy(expected: Sequence[str], correct: Sequence[bool]) -> float:
    """The mean over the labels that occur as expected of the share of their rows answered
    right (recall per label): a target that always says the majority label scores 1/labels."""
    if not expected:
        return 0.0
    totals = Counter(expected)
    hits = Counter(e for e, c in zip(expected, correct) if c)
    return float(np.mean([hits[label] / n for label, n in totals.items()]))


def reliability(confidences: Sequence[float], correct: Sequence[bool]) -> list[dict[str, Any]]:
    """The reliability diagram's points: the bins `calibrate.ece` uses ([0, 0.1), ...,
    [0.9, 1.0]), each with its rows, mean confidence and accuracy (None when empty)."""
    conf = np.asarray(confidences, dtype=np.float64)
    hit = np.asarray(correct, dtype=np.float64)
    which = np.minimum(np.floor(conf * BINS).astype(int), BINS - 1)
    out = []
    for b in range(BINS):
        mask = which == b
        n = int(mask.sum())
        out.append(
            {
                "bin": [b / BINS, (b + 1) / BINS],
                "rows": n,
                "confidence": float(conf[mask].mean()) if n else None,
                "accuracy": float(hit[mask].mean()) if n else None,
            }
        )
    return out


def confusion(expected: Sequence[str], predicted: Sequence[str]) -> dict[str, Any]:
    """Counts of (expected, predicted) over the most frequent labels; `matrix[i][j]` is the
    rows expected labels[i] and answered labels[j]."""
    freq = Counter(expected) + Counter(predicted)
    top = [label for label, _ in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))]
    labels = top[:CONFUSION_LABELS]
    if len(top) > CONFUSION_LABELS:
        labels.append(OTHER)
    index = {label: i for i, label in enumerate(labels)}
    matrix = [[0] * len(labels) for _ in labels]
    for e, p in zip(expected, predicted):
        matrix[index.get(e, len(labels) - 1)][index.get(p, len(labels) - 1)] += 1
    return {"labels": labels, "matrix": matrix}


def latency(seconds: Sequence[float]) -> dict[str, float | None]:
    if not seconds:
        return {"p50": None, "p95": None, "max": None}
    s = np.asarray(seconds, dtype=np.float64)
    return {
        "p50": float(np.percentile(s, 50)),
        "p95": float(np.percentile(s, 95)),
        "max": float(s.max()),
    }


def target_metrics(name: str, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One target's scores over the rows it answered (`answered` of `rows`)."""
    done = [(r, r["answers"][name]) for r in rows if "predicted" in r["answers"][name]]
    expected = [r["expected"] for r, _ in done]
    correct = [a["correct"] for _, a in done]
    confidences = [a["probability"] for _, a in done]
    tokens = [a["input_tokens"] for _, a in done]
    return {
        "rows": len(rows),
        "answered": len(done),
        "errors": len(rows) - len(done),
        "correct": sum(correct),
        "accuracy": sum(correct) / len(done) if done else 0.0,
        "balanced_accuracy": balanced_accuracy(expected, correct),
        "ece": ece(confidences, correct, BINS),
        "reliability": reliability(confidences, correct),
        "confusion": confusion(expected, [a["predicted"] for _, a in done]),
        "latency_seconds": latency([a["seconds"] for _, a in done]),
        "input_tokens": {
            "total": sum(tokens),
            "mean": sum(tokens) / len(tokens) if tokens else 0.0,
        },
    }


def disagreements(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows on which the targets that answered did not all give the same argmax label,
    with each one's label and the probability it gave that label."""
    out = []
    for r in rows:
        answered = {n: a for n, a in r["answers"].items() if "predicted" in a}
        if len({a["predicted"] for a in answered.values()}) > 1:
            out.append(
                {
                    "line": r["line"],
                    "id": r["id"],
                    "expected": r["expected"],
                    "answers": {
                        n: {"predicted": a["predicted"], "probability": a["probability"]}
                        for n, a in answered.items()
                    },
                }
            )
    return out


def evaluate(
    rows_file: Path,
    targets: Sequence[Target],
    limit: int | None = None,
    progress: bool = True,
    *,
    concurrency: int = 1,
    rows_log: Path | None = None,
    resume: bool = False,
    retries: Retries | None = None,
) -> dict[str, Any]:
    """Read the rows, ask every target, score them: the whole results document. With
    `rows_log`, each answer is appended there as it comes; with `resume`, the answers already
    there are kept and only the rest asked."""
    rows, bad = read_rows(rows_file, limit)
    kept = Kept()
    log = None
    if rows_log is not None:
        if resume:
            kept = read_kept(rows_log, rows, targets)
        log = open_rows_log(rows_log, resume)
    try:
        asked = ask_all(
            rows,
            targets,
            concurrency=concurrency,
            kept=kept.answers,
            log=log,
            retries=retries,
            progress=progress,
        )
    finally:
        if log is not None:
            log.close()
    results = [
        {
            "line": row.line,
            "id": row.id,
            "kind": row.kind,
            "expected": row.expected,
            "answers": {t.name: asked.answers[(row.line, t.name)] for t in targets},
        }
        for row in rows
    ]
    return {
        "rows_file": str(rows_file),
        "rows": len(rows),
        "bad_rows": [{"line": b.line, "id": b.id, "error": b.error} for b in bad],
        "bins": BINS,
        "targets": [{**t.describe(), "metrics": target_metrics(t.name, results)} for t in targets],
        "disagreements": disagreements(results),
        "results": results,
        "run": {
            "concurrency": concurrency,
            "resumed": asked.resumed,
            "retries": asked.retried,
            "rows_log": None if rows_log is None else str(rows_log),
            "rows_log_unreadable_lines": kept.unreadable,
            "rows_log_stale_records": kept.stale,
        },
    }


def summary(results: dict[str, Any]) -> list[str]:
    """The run in a few lines for the terminal: bad rows, then one line per target."""
    lines = [
        f"{results['rows_file']}:{b['line']}: bad row: {b['error']}" for b in results["bad_rows"]
    ]
    for t in results["targets"]:
        m = t["metrics"]
        p50 = m["latency_seconds"]["p50"]
        lines.append(
            f"{t['name']}: answered {m['answered']}/{m['rows']}  accuracy {m['accuracy']:.3f}  "
            f"balanced {m['balanced_accuracy']:.3f}  ECE {m['ece']:.3f}  "
            f"p50 {'-' if p50 is None else f'{p50 * 1000:.0f} ms'}"
        )
    lines.append(f"disagreements: {len(results['disagreements'])} rows")
    run = results.get("run", {})
    if run.get("resumed"):
        lines.append(f"resumed: {run['resumed']} answers kept from {run['rows_log']}")
    if run.get("retries"):
        lines.append(f"retries: {run['retries']} (after a 429 or 503)")
    if results["rows"] == 0:
        lines.append("no valid rows")
    return lines


def exit_status(results: dict[str, Any]) -> int:
    """0: every row asked and answered; 1: some rows bad or some answers failed; 2: no row."""
    if results["rows"] == 0:
        return 2
    failed = any(t["metrics"]["errors"] for t in results["targets"])
    return 1 if failed or results["bad_rows"] else 0
