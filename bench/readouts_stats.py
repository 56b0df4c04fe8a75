"""The statistics of `python -m bench.readouts`, pure (numpy only): a Wilson score interval, a
paired bootstrap interval of a difference in accuracy, the expected calibration error and
percentiles. Tested against independent references in tests/test_bench_readouts.py."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bench import common

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile
# The paired bootstrap: resamples and a fixed seed (the same rows give the same interval).
RESAMPLES = 2_000
SEED = 20261201
BINS = 10


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of the proportion k/n (95 % by default); (0, 1) when n is 0."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float, float] | None:
    """mean(a - b) over pairs, and its percentile bootstrap 95 % interval (pairs resampled
    with replacement, `resamples` times, a fixed seed); None without pairs."""
    if len(a) != len(b):
        raise ValueError("paired samples differ in length")
    if not a:
        return None
    diff = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(resamples, len(diff)))
    means = diff[idx].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(diff.mean()), float(lo), float(hi)


def ece(confidences: Sequence[float], correct: Sequence[bool], bins: int = BINS) -> float:
    """Expected calibration error over `bins` equal-width bins of [0, 1] (bin b holds
    b/bins <= c < (b+1)/bins, the last also c == 1): the gap between each bin's accuracy and
    mean confidence, weighted by its share of the predictions; 0 for none."""
    n = len(confidences)
    if n == 0:
        return 0.0
    sums: dict[int, list[float]] = {}
    for c, ok in zip(confidences, correct):
        b = min(math.floor(c * bins), bins - 1)
        acc = sums.setdefault(b, [0.0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += c
        acc[2] += 1.0 if ok else 0.0
    return float(sum(cnt / n * abs(hits / cnt - conf / cnt) for cnt, conf, hits in sums.values()))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between the closest ranks (numpy's default); None
    for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median_interval(values: list[float]) -> tuple[float, float | None, float | None]:
    """The median of the values (per-round ratios, per-request seconds) and its bootstrap 95 %
    interval (values resampled; the benchmark report's resamples and seed, bench/common.py, not
    the readouts' own); no interval under MIN_PAIRS values."""
    v = np.asarray(values, dtype=float)
    if len(v) < common.MIN_PAIRS:
        return float(np.median(v)), None, None
    rng = np.random.default_rng(common.SEED)
    idx = rng.integers(0, len(v), size=(common.BOOTSTRAP, len(v)))
    lo, hi = np.percentile(np.median(v[idx], axis=1), [2.5, 97.5])
    return float(np.median(v)), float(lo), float(hi)
