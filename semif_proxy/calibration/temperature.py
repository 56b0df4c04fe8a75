"""Temperature calibration: fit one softmax temperature per question type on recorded option
logits and labels, by minimising the negative log-likelihood.

Pure numpy, no engine. Dividing logits by a positive temperature never changes the argmax, so
calibration changes how sure the answers say they are, never which option they pick. A position
prior (position_prior.py, fitted from unlabelled rotated rows) does change the argmax; when one
is given, the temperature is fitted on the logits with the prior divided out, as they are
served.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from semif_proxy.calibration.position_prior import PositionPrior
from semif_proxy.jsonl_files import json_objects
from semif_proxy.readout import softmax

GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
# Searched over the inverse temperature; the NLL is convex in it (a log-sum-exp minus a linear
# term), so golden-section search finds the one minimum.
BETA_RANGE = (0.01, 20.0)


class PredictionError(ValueError):
    pass


@dataclass(frozen=True)
class Prediction:
    kind: str
    logits: np.ndarray
    label: int


def parse_prediction(row: dict[str, Any], where: str) -> Prediction:
    kind = str(row.get("type", "decision"))
    logits = row.get("option_logits")
    if not isinstance(logits, list) or len(logits) < 2:
        raise PredictionError(f"{where}: option_logits must be a list of at least 2 numbers")
    label = row.get("label")
    if label is None and "expected" in row and isinstance(row.get("option_ids"), list):
        ids = [str(i) for i in row["option_ids"]]
        if str(row["expected"]) not in ids:
            raise PredictionError(f"{where}: expected {row['expected']!r} is not in option_ids")
        label = ids.index(str(row["expected"]))
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(logits):
        raise PredictionError(
            f"{where}: label must be an option index in [0, {len(logits)}) "
            "(or give expected + option_ids)"
        )
    z = np.asarray(logits, dtype=np.float64)
    free = row.get("content_free_logits")
    if free is not None:
        # A contextually corrected answer is served as softmax((z - z_cf) / T): the
        # temperature is fitted on what is served (yes/no questions are corrected by default).
        if not isinstance(free, list) or len(free) != len(logits):
            raise PredictionError(f"{where}: content_free_logits must match option_logits")
        z = z - np.asarray(free, dtype=np.float64)
    return Prediction(kind, z, label)


def read_predictions(path: Path) -> list[Prediction]:
    out = [parse_prediction(row, where) for where, row in json_objects(path, PredictionError)]
    if not out:
        raise PredictionError(f"{path}: no predictions")
    return out


def nll(preds: Iterable[Prediction], temperature: float) -> float:
    total = 0.0
    count = 0
    for p in preds:
        z = p.logits / temperature
        top = z.max()
        total += top + math.log(float(np.exp(z - top).sum())) - z[p.label]
        count += 1
    return total / max(count, 1)


def golden_min(f: Callable[[float], float], lo: float, hi: float, tol: float = 1e-5) -> float:
    a, b = lo, hi
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol * (1.0 + abs(a) + abs(b)):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = f(d)
    return (a + b) / 2.0


def fit_temperature(preds: list[Prediction]) -> float:
    beta = golden_min(lambda b: nll(preds, 1.0 / b), *BETA_RANGE)
    return 1.0 / beta


def ece(confidences: Sequence[float], correct: Sequence[bool], bins: int = 10) -> float:
    """Expected calibration error: over equal-width confidence bins, the gap between accuracy
    and mean confidence, weighted by the bin's share of all predictions.

    The bins split [0, 1] into `bins` equal parts; bin b holds the confidences c with
    b/bins <= c < (b+1)/bins (c * bins rounded down), and the last bin also holds c == 1.0. With
    the default 10 bins: [0, 0.1), [0.1, 0.2), ..., [0.8, 0.9), [0.9, 1.0]. The one definition
    used for `semif-proxy calibrate` and the JevBench benchmark."""
    conf = np.asarray(confidences, dtype=np.float64)
    hit = np.asarray(correct, dtype=np.float64)
    if conf.size == 0:
        return 0.0
    which = np.minimum(np.floor(conf * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        mask = which == b
        if mask.any():
            total += mask.mean() * abs(hit[mask].mean() - conf[mask].mean())
    return float(total)


def prediction_ece(preds: list[Prediction], temperature: float, bins: int = 10) -> float:
    """ECE of the argmax probability of each prediction's softmax at this temperature."""
    probs = [softmax(p.logits, temperature) for p in preds]
    return ece(
        [float(q.max()) for q in probs],
        [int(np.argmax(q)) == p.label for q, p in zip(probs, preds)],
        bins,
    )


def debiased(preds: list[Prediction], prior: PositionPrior) -> list[Prediction]:
    """Each prediction with the prior of its type and option count divided out of its logits,
    as the server does (the logits are one order's: position j lists option j)."""
    out = []
    for p in preds:
        log_prior = prior.log_prior(p.kind, len(p.logits))
        logits = p.logits if log_prior is None else p.logits - np.asarray(log_prior)
        out.append(Prediction(p.kind, logits, p.label))
    return out


def accuracy(preds: list[Prediction]) -> float:
    return float(np.mean([int(np.argmax(p.logits)) == p.label for p in preds]))


def calibrate(preds: list[Prediction], prior: PositionPrior | None = None) -> dict[str, Any]:
    """Per type: fitted temperature, NLL and ECE before/after. The result's `temperature`
    block is what SEMIF_CALIBRATION (or SEMIF_TEMPERATURE) reads (the whole file can be given).
    With a position prior, `after` is the prior and the temperature together, and
    `accuracy_after` the accuracy with the prior (`accuracy` stays the raw one)."""
    kinds = sorted({p.kind for p in preds})
    report: dict[str, Any] = {"temperature": {"default": 1.0}, "types": {}}
    for kind in kinds:
        group = [p for p in preds if p.kind == kind]
        served = group if prior is None else debiased(group, prior)
        t = fit_temperature(served)
        report["temperature"][kind] = round(t, 6)
        report["types"][kind] = {
            "count": len(group),
            "temperature": t,
            "nll_before": nll(group, 1.0),
            "nll_after": nll(served, t),
            "ece_before": prediction_ece(group, 1.0),
            "ece_after": prediction_ece(served, t),
            "accuracy": accuracy(group),
        }
        if prior is not None:
            report["types"][kind]["accuracy_after"] = accuracy(served)
            report["types"][kind]["position_prior_applied"] = sum(
                prior.log_prior(kind, len(p.logits)) is not None for p in group
            )
    return report
