"""What eval computes per target: accuracy, balanced accuracy, ECE and its reliability table, the
confusion of the most frequent labels, latency and tokens; and the rows targets disagree on."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from semif_proxy.calibration.temperature import ece
from semif_proxy.eval.rows import Row
from semif_proxy.eval.targets import Answer

BINS = 10
# The confusion table keeps the most frequent labels; the rest are counted as OTHER.
CONFUSION_LABELS = 8
OTHER = "(other)"


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
