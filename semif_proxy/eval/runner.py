"""`semif-proxy eval`: labelled rows asked of one or more targets, scored side by side.

A row is a JevBench row (`state`, `question`, `expected`: a System One question) or a labelled
decision (`{"decision": {...}, "expected": "<option id>"}`). Every valid row is asked of every
target (eval_targets.py); each target gets accuracy, balanced accuracy, ECE, a reliability
table, the confusion of its most frequent labels, latency and tokens, and the rows on which the
targets' argmax labels differ are listed. A row that cannot be asked (not JSON, no `expected`,
a label the question does not have) is reported and skipped; a row a target fails is that
target's error on that row. Neither stops the run.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from semif_proxy.calibration.temperature import ece
from semif_proxy.errors import ApiError
from semif_proxy.eval.jevbench import Task
from semif_proxy.eval.targets import Answer, Failure, Target

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


class Progress:
    """A one-line bar on stderr, redrawn in place on a terminal; elsewhere (a log, a CI job)
    a line at every tenth of the way, so the log is not one long line of carriage returns."""

    def __init__(self, total: int, stream: IO[str] | None = None, width: int = 30) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self._tenth = -1

    def step(self, label: str) -> None:
        self.done += 1
        tenth = 10 * self.done // self.total
        if not self.tty and tenth == self._tenth and self.done < self.total:
            return
        self._tenth = tenth
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.monotonic() - self.start
        text = f"eval [{bar}] {self.done}/{self.total} {elapsed:5.1f}s {label[:60]}"
        if self.tty:
            self.stream.write("\r" + text.ljust(120))  # over the longer line before
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def ask_all(
    rows: Sequence[Row], targets: Sequence[Target], progress: Progress | None = None
) -> list[dict[str, Answer | Failure]]:
    """Per row, each target's answer or failure (by target name)."""
    out: list[dict[str, Answer | Failure]] = []
    for row in rows:
        answers: dict[str, Answer | Failure] = {}
        for target in targets:
            answers[target.name] = target.ask(row.route, row.body)
            if progress is not None:
                progress.step(f"{row.id} @ {target.name}")
        out.append(answers)
    return out


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
) -> dict[str, Any]:
    """Read the rows, ask every target, score them: the whole results document."""
    rows, bad = read_rows(rows_file, limit)
    bar = Progress(len(rows) * len(targets)) if progress and rows else None
    answers = ask_all(rows, targets, bar)
    results = []
    for row, by_target in zip(rows, answers):
        results.append(
            {
                "line": row.line,
                "id": row.id,
                "kind": row.kind,
                "expected": row.expected,
                "answers": {
                    name: scored(row, a) if isinstance(a, Answer) else a.as_dict()
                    for name, a in by_target.items()
                },
            }
        )
    return {
        "rows_file": str(rows_file),
        "rows": len(rows),
        "bad_rows": [{"line": b.line, "id": b.id, "error": b.error} for b in bad],
        "bins": BINS,
        "targets": [{**t.describe(), "metrics": target_metrics(t.name, results)} for t in targets],
        "disagreements": disagreements(results),
        "results": results,
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
    if results["rows"] == 0:
        lines.append("no valid rows")
    return lines


def exit_status(results: dict[str, Any]) -> int:
    """0: every row asked and answered; 1: some rows bad or some answers failed; 2: no row."""
    if results["rows"] == 0:
        return 2
    failed = any(t["metrics"]["errors"] for t in results["targets"])
    return 1 if failed or results["bad_rows"] else 0
