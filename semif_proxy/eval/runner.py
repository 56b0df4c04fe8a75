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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from semif_proxy.eval.asking import (
    RETRY_BUDGET,
    RETRY_TRIES,
    Interrupted,
    Kept,
    Limiter,
    Retries,
    ask_all,
    ask_one,
    open_rows_log,
    read_kept,
    rows_log_path,
)
from semif_proxy.eval.metrics import (
    BINS,
    CONFUSION_LABELS,
    OTHER,
    disagreements,
    target_metrics,
)
from semif_proxy.eval.rows import BadRow, Row, RowError, parse_row, read_rows
from semif_proxy.eval.targets import Target


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


# The rows, asking and metrics modules' names that callers use from here.
__all__ = [
    "BINS",
    "CONFUSION_LABELS",
    "OTHER",
    "RETRY_BUDGET",
    "RETRY_TRIES",
    "BadRow",
    "Interrupted",
    "Limiter",
    "Retries",
    "Row",
    "RowError",
    "ask_one",
    "evaluate",
    "exit_status",
    "parse_row",
    "read_rows",
    "rows_log_path",
    "summary",
]
