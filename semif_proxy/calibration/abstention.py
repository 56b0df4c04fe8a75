"""Abstention that means the same at 2 and at 50 options.

An answer abstains when its confidence, (n * p_max - 1) / (n - 1) (`readout.confidence`), is
below a threshold. That confidence is 0 for a uniform answer whatever the option count, but a
model that is right as often spreads more probability over near-misses when there are more
options: one number abstains far more often at 50 options than at 2. So `min_confidence` is
one number or a map by question type and option-count bucket, and `suggest_thresholds` fits,
from labelled rows, the threshold of each (type, bucket) that reaches a target accuracy on the
answers it keeps.

Pure: no engine, no HTTP. A bad value raises ThresholdError with its path in the value, which
the API turns into a 422 at `body.min_confidence.<path>` and the settings into an error naming
SEMIF_MIN_CONFIDENCE.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from pydantic_core import core_schema

from semif_proxy import readout
from semif_proxy.calibration.question_types import DEFAULT
from semif_proxy.calibration.question_types import QUESTION_TYPES as KINDS

# Option-count buckets. 2 alone: every noul and every yes/no decision, the common case. Then
# doublings (3-4, 5-8, 9-16): how far a model's probability spreads over near-misses grows with
# the log of the option count, not with the count. 17-26 ends at the last one-letter label
# (prompt.LETTERS); past 26 options the labels are longer than a letter and read another way,
# so their confidence gets buckets of its own, 27-64 and 65+ (up to the option limit): wide,
# because few labelled sets hold many rows with that many options.
BUCKETS = ("2", "3-4", "5-8", "9-16", "17-26", "27-64", "65+")
_LAST = (2, 4, 8, 16, 26, 64)  # the largest option count of each bucket but the last
# A bucket needs this many labelled rows for a suggestion, and a suggested threshold must keep
# at least MIN_KEPT of them: an accuracy measured on fewer rows is mostly noise.
MIN_ROWS = 30
MIN_KEPT = 10


def bucket(n_options: int) -> str:
    """The option-count bucket. A one-option question (answered without the model, confidence
    1) goes with the 2-option ones: it passes any threshold."""
    if n_options < 1:
        raise ValueError(f"a question has at least 1 option, got {n_options}")
    for name, last in zip(BUCKETS, _LAST):
        if n_options <= last:
            return name
    return BUCKETS[-1]


class ThresholdError(ValueError):
    """A bad min_confidence. `path` is where in the value: ("choice", "3-4"), or () for the
    value itself."""

    def __init__(self, path: tuple[str, ...], message: str) -> None:
        super().__init__(f"{'.'.join(path)}: {message}" if path else message)
        self.path = path
        self.message = message


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, list, dict)) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(value: Any, path: tuple[str, ...]) -> float:
    if not _is_number(value):
        raise ThresholdError(path, f"must be a number from 0 to 1, got {_show(value)}")
    if not 0.0 <= float(value) <= 1.0:
        raise ThresholdError(path, f"must be from 0 to 1 (a confidence), got {value!r}")
    return float(value)


def _by_bucket(value: Any, kind: str, path: tuple[str, ...]) -> float | dict[str, float]:
    if _is_number(value):
        return _number(value, path)
    if not isinstance(value, dict):
        raise ThresholdError(
            path,
            "must be a number from 0 to 1 or a map by option count "
            f'({{"2": 0.3, "3-4": 0.4, ..., "default": 0.5}}), got {_show(value)}',
        )
    allowed = ("2", DEFAULT) if kind == "noul" else (*BUCKETS, DEFAULT)
    out: dict[str, float] = {}
    for key, item in value.items():
        if key not in allowed:
            why = " (a noul question always has 2 options)" if kind == "noul" else ""
            raise ThresholdError(
                (*path, key),
                f"unknown option-count bucket {_show(key)}{why}; "
                f"expected one of {', '.join(allowed)}",
            )
        out[key] = _number(item, (*path, key))
    return out


@dataclass(frozen=True)
class Thresholds:
    """min_confidence, checked: a number for every answer, or {type or "default": number or
    {bucket or "default": number}}."""

    value: float | dict[str, float | dict[str, float]]

    @classmethod
    def parse(cls, value: Any) -> Thresholds:
        if isinstance(value, Thresholds):
            return value
        if not isinstance(value, dict):
            if _is_number(value):
                return cls(_number(value, ()))
            raise ThresholdError(
                (),
                "must be a number from 0 to 1, or a map by question type "
                f"({', '.join(KINDS)}, default) and option count, got {_show(value)}",
            )
        out: dict[str, float | dict[str, float]] = {}
        for key, item in value.items():
            if key not in (*KINDS, DEFAULT):
                raise ThresholdError(
                    (str(key),),
                    f"unknown question type {_show(key)}; expected one of "
                    f"{', '.join((*KINDS, DEFAULT))}",
                )
            out[key] = _by_bucket(item, key, (key,))
        return cls(out)

    def threshold_for(self, kind: str, n_options: int) -> float | None:
        """The threshold for an answer of this type and option count, the most specific entry
        first: [kind][bucket], [kind][default] (or [kind] when a number), then the same under
        "default". None: no entry applies, the answer is not judged."""
        if not isinstance(self.value, dict):
            return self.value
        name = bucket(n_options)
        for entry in (self.value.get(kind), self.value.get(DEFAULT)):
            if isinstance(entry, float):
                return entry
            if isinstance(entry, dict):
                found = entry.get(name, entry.get(DEFAULT))
                if found is not None:
                    return found
        return None

    def to_json(self) -> float | dict[str, Any]:
        if isinstance(self.value, dict):
            return {k: dict(v) if isinstance(v, dict) else v for k, v in self.value.items()}
        return self.value

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        # A settings field: checked by parse (a ThresholdError is a ValueError), dumped as JSON.
        return core_schema.no_info_plain_validator_function(
            cls.parse,
            serialization=core_schema.plain_serializer_function_ser_schema(lambda t: t.to_json()),
        )


def from_setting(text: str) -> Thresholds:
    """SEMIF_MIN_CONFIDENCE: a number, a JSON map, or the path of a JSON file holding a
    `min_confidence` key (what `semif-proxy calibrate --target-accuracy` writes)."""
    text = text.strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = _calibration_file(text)
    if isinstance(value, dict) and "min_confidence" in value:
        value = value["min_confidence"]
    return Thresholds.parse(value)


def _calibration_file(text: str) -> dict[str, Any]:
    path = Path(text)
    if not path.is_file():
        raise ValueError(
            f"expected a number from 0 to 1, a JSON map or a calibration file, got {_show(text)}"
        )
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"calibration file {text!r} is not JSON: {exc}") from None
    if not isinstance(value, dict) or "min_confidence" not in value:
        raise ValueError(
            f"calibration file {text!r} has no min_confidence "
            "(semif-proxy calibrate --target-accuracy writes one)"
        )
    return value


# -- suggestions from labelled rows -----------------------------------------------------------


class Row(Protocol):
    """A labelled row (calibrate.Prediction): its type, option logits, the right option."""

    kind: str
    logits: np.ndarray
    label: int


def _round_down(conf: float, below: float) -> float:
    """The shortest decimal for the threshold `conf` that keeps exactly the same rows: `conf`
    rounded down to the fewest digits that still leave the next lower confidence (`below`)
    under it."""
    for digits in range(1, 16):
        short = round(math.floor(conf * 10**digits) / 10**digits, digits)
        if below < short <= conf:
            return short
    return conf


def _fit(
    kind: str,
    name: str,
    points: list[tuple[float, bool]],
    target: float,
    min_rows: int,
    min_kept: int,
) -> dict[str, Any]:
    conf = np.array([c for c, _ in points], dtype=np.float64)
    hit = np.array([h for _, h in points], dtype=bool)
    entry: dict[str, Any] = {
        "type": kind,
        "bucket": name,
        "rows": len(points),
        "accuracy_all": float(hit.mean()),
    }
    if kind not in KINDS:
        return entry | {"status": "unknown type", "threshold": None}
    if len(points) < min_rows:
        return entry | {"status": "too few rows", "needs": min_rows, "threshold": None}
    order = np.argsort(-conf, kind="stable")
    ranked, hits = conf[order], np.cumsum(hit[order])
    best = None  # the least confident row kept by the smallest threshold that reaches target
    for i in range(len(ranked)):
        if i + 1 < len(ranked) and ranked[i + 1] == ranked[i]:
            continue  # rows of equal confidence are kept or dropped together
        kept = i + 1
        if kept >= min_kept and hits[i] / kept >= target - 1e-12:
            best = i
    if best is None:
        # No threshold keeps enough rows right often enough: abstain on (nearly) all of them.
        threshold, status = 1.0, "unreachable"
    elif best == len(ranked) - 1:
        threshold, status = 0.0, "ok"  # every row together already reaches the target
    else:
        threshold, status = _round_down(float(ranked[best]), float(ranked[best + 1])), "ok"
    kept_mask = conf >= threshold  # the server's rule: abstained when confidence < threshold
    n_kept = int(kept_mask.sum())
    return entry | {
        "status": status,
        "threshold": threshold,
        "kept": n_kept,
        "coverage": n_kept / len(points),
        "accuracy": float(hit[kept_mask].mean()) if n_kept else None,
    }


def suggest_thresholds(
    rows: Iterable[Row],
    target_accuracy: float,
    temperatures: Mapping[str, float] | None = None,
    min_rows: int = MIN_ROWS,
    min_kept: int = MIN_KEPT,
) -> dict[str, Any]:
    """Per (type, option-count bucket): the smallest confidence threshold whose kept rows
    (confidence >= threshold) are right at least `target_accuracy` of the time, with at least
    `min_kept` rows kept; the most coverage for that accuracy. Probabilities are the softmax of
    each row's logits at its type's temperature (`temperatures`: calibrate's fitted block,
    {"default": ..., type: ...}; 1.0 without).

    Returns `min_confidence` (the map SEMIF_MIN_CONFIDENCE and requests take; buckets with too
    few rows are left out, so no threshold applies there) and `buckets`, one entry per (type,
    bucket) seen: rows, status ("ok", "unreachable": threshold 1.0, "too few rows": `needs`),
    threshold, kept, coverage (share kept), accuracy (of the kept) and accuracy_all."""
    if not 0.0 < target_accuracy <= 1.0:
        raise ValueError(f"target accuracy must be in (0, 1], got {target_accuracy!r}")
    temps = dict(temperatures or {})
    groups: dict[tuple[str, str], list[tuple[float, bool]]] = {}
    for row in rows:
        t = float(temps.get(row.kind, temps.get(DEFAULT, 1.0)))
        probs = readout.softmax(np.asarray(row.logits, dtype=np.float64), t)
        point = (readout.confidence(probs), int(np.argmax(probs)) == row.label)
        groups.setdefault((row.kind, bucket(len(probs))), []).append(point)

    def rank(key: tuple[str, str]) -> tuple[int, str, int]:
        kind, name = key
        return (KINDS.index(kind) if kind in KINDS else len(KINDS), kind, BUCKETS.index(name))

    entries = [
        _fit(kind, name, groups[(kind, name)], target_accuracy, min_rows, min_kept)
        for kind, name in sorted(groups, key=rank)
    ]
    suggested: dict[str, dict[str, float]] = {}
    for e in entries:
        if e["threshold"] is not None:
            suggested.setdefault(e["type"], {})[e["bucket"]] = e["threshold"]
    return {
        "target_accuracy": target_accuracy,
        "min_rows": min_rows,
        "min_kept": min_kept,
        "min_confidence": suggested,
        "buckets": entries,
    }


def table(suggestion: dict[str, Any]) -> list[str]:
    """The per-bucket table `semif-proxy calibrate --target-accuracy` prints."""
    lines = [
        f"min_confidence for accuracy >= {suggestion['target_accuracy']} on the answers kept "
        "(confidence >= threshold, as served):",
        f"{'type':>9} {'options':>7} {'rows':>5} {'threshold':>9} {'kept':>5} {'coverage':>8} "
        f"{'accuracy':>8} {'all rows':>8}",
    ]
    for e in suggestion["buckets"]:
        head = f"{e['type']:>9} {e['bucket']:>7} {e['rows']:>5}"
        if e["threshold"] is None:
            why = e["status"]
            if "needs" in e:
                why += f": needs {e['needs']} rows, no threshold"
            lines.append(
                f"{head} {'-':>9} {'-':>5} {'-':>8} {'-':>8} {e['accuracy_all']:>8.3f}  {why}"
            )
            continue
        kept = "-" if e["accuracy"] is None else f"{e['accuracy']:.3f}"
        note = "  unreachable: abstains on all but certain answers" if e["status"] != "ok" else ""
        lines.append(
            f"{head} {e['threshold']!s:>9} {e['kept']:>5} {e['coverage']:>8.3f} {kept:>8} "
            f"{e['accuracy_all']:>8.3f}{note}"
        )
    return lines
