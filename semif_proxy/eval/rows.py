"""The labelled rows `semif-proxy eval` reads: JevBench rows (System One questions) and labelled
decisions; a row that cannot be asked is reported with its line and skipped."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semif_proxy.errors import ApiError
from semif_proxy.eval.jevbench import Task


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
    _asked_alone(parsed.body)
    if parsed.expected not in parsed.labels:
        raise RowError(
            f"expected: {parsed.expected!r} is not one of the question's labels "
            f"{list(parsed.labels)}"
        )
    return parsed


def _asked_alone(body: dict[str, Any]) -> None:
    """eval asks each row in a request of its own (as a client would): a batch correction,
    which calibrates over the requests answered together, would have no batch there."""
    asked = [body.get("decision") or {}, *(body.get("questions") or {}).values()]
    if any(isinstance(q, dict) and q.get("bias_correction") == "batch" for q in asked):
        raise RowError(
            "bias_correction: batch calibrates over the questions answered together, and eval "
            "asks each row alone; send such rows as one JSON Lines body (docs/api.md)"
        )


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
