"""The summary of `python -m bench.readouts`: bench/results/readouts-TAG.json from its rows.

Per configuration and permutations (a "run", e.g. `continuation-pmi@N`), per split (and all)
and question type (and all): n, correct, accuracy with a Wilson 95 % interval; the paired
difference in accuracy against `letters` at the same permutations, over the tasks both
answered, with a bootstrap 95 % interval (2,000 resamples, a fixed seed); the ECE (10 bins) of
the predicted label's probability; p50 / p95 latency; and the cost against letters (this run's
p50 latency / letters' p50, both over the paired tasks). The continuation runs also carry
their paired differences against each other normalization at the same permutations
(`vs_normalizations`): what chooses the default normalization (docs: "Defaults from the
evidence").
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from bench.readouts import CONFIGS, NAMES
from bench.readouts_rows import numbers_current, read_rows, timed
from bench.readouts_stats import RESAMPLES, SEED, ece, paired_bootstrap, percentile, wilson

SPLIT_ORDER = ("easy", "original", "hard")
TYPE_ORDER = ("noul", "choice", "score")
# The continuation runs, one per normalization, none corrected.
CONTINUATIONS = tuple(
    c for c, f in CONFIGS.items() if f.get("readout") == "continuation" and len(f) == 2
)
NOTES = [
    "direct reads the model's own yes/no or level-number words: it applies to noul and score "
    "questions only; under `direct` and `direct+contextual` choice questions are asked with "
    "letters (and letters+contextual): the same request, so the letters row of the task is "
    "reused (`copied_from` in the rows; its latency too)",
    "permutations N: each task asked in every cyclic order of its options (its option count), "
    "the probabilities averaged",
    "latency: seconds of plan + answer in-process (no HTTP), on a machine shared with other "
    "work; load1 is the 1-minute load average when each task started",
    "difference vs letters: accuracy(run) - accuracy(letters at the same permutations) over "
    f"the tasks both answered; percentile bootstrap of tasks, {RESAMPLES} resamples, seed {SEED}",
    "a run with fewer tasks than a split holds was asked in part (`--limit`, `--families`, or "
    "stopped by `--max-minutes`): its accuracy is over the tasks it answered, which need not "
    "be like the rest of the split (per family: the section on what qwen2.5-1.5b still gets "
    "wrong)",
]


def _order(values: set[str], first: tuple[str, ...]) -> list[str]:
    return [v for v in first if v in values] + sorted(values - set(first))


def run_name(config: str, permutations: str) -> str:
    return f"{config}@{permutations}"


def cell(rows: list[dict[str, Any]], letters: dict[tuple[str, str], dict[str, Any]] | None):
    n = len(rows)
    k = sum(bool(r["correct"]) for r in rows)
    # Latency from the rows whose seconds count (readouts_rows.timed); accuracy from all.
    clocked = [r for r in rows if timed(r)]
    seconds = [r["seconds"] for r in clocked]
    out: dict[str, Any] = {
        "n": n,
        "correct": k,
        "accuracy": k / n if n else None,
        "wilson95": list(wilson(k, n)) if n else None,
        "ece": ece([r["p_predicted"] for r in rows], [r["correct"] for r in rows]) if n else None,
        "latency_p50": percentile(seconds, 50),
        "latency_p95": percentile(seconds, 95),
        "cpu_p50": percentile([r["cpu_seconds"] for r in clocked if "cpu_seconds" in r], 50),
        "input_tokens_p50": percentile([r["input_tokens"] for r in rows], 50),
    }
    if letters is not None:
        pairs = paired_rows(rows, letters)
        # Costs from cold rows only (bench/readouts.py cold_start): before, a config asked after
        # another could find the state's prefix still held and look cheaper than it is; and
        # from rows timed on the engine their readout has now (readouts_rows.timed).
        cold = [(r, b) for r, b in pairs if timed(r) and timed(b)]
        base = percentile([b["seconds"] for _, b in cold], 50)
        mine = percentile([r["seconds"] for r, _ in cold], 50)
        with_cpu = [(r, b) for r, b in cold if "cpu_seconds" in r and "cpu_seconds" in b]
        cpu_base = percentile([b["cpu_seconds"] for _, b in with_cpu], 50)
        cpu_mine = percentile([r["cpu_seconds"] for r, _ in with_cpu], 50)
        out["vs_letters"] = {
            **difference(pairs),
            "cost_ratio": mine / base if cold and base else None,
            "cost_pairs": len(cold),
            "cpu_cost_ratio": cpu_mine / cpu_base if with_cpu and cpu_base else None,
            "cpu_pairs": len(with_cpu),
        }
    return out


def paired_rows(rows: list[dict[str, Any]], other: dict[tuple[str, str], dict[str, Any]]):
    """(row, the other run's row of the same task) for the tasks both answered."""
    return [(r, other[(r["split"], r["id"])]) for r in rows if (r["split"], r["id"]) in other]


def difference(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """accuracy(first) - accuracy(second) over the pairs, with its bootstrap interval."""
    diff = paired_bootstrap(
        [float(r["correct"]) for r, _ in pairs], [float(o["correct"]) for _, o in pairs]
    )
    return {
        "pairs": len(pairs),
        "difference": diff[0] if diff else None,
        "bootstrap95": [diff[1], diff[2]] if diff else None,
    }


def vs_normalizations(ok: list[dict[str, Any]], config: str, spec: str) -> dict[str, Any]:
    """A continuation run against each other normalization's run at the same permutations,
    over all tasks and per question type."""

    def of(c: str) -> list[dict[str, Any]]:
        return [r for r in ok if r["config"] == c and str(r["permutations"]) == spec]

    mine = of(config)
    kinds = ["all", *_order({r["type"] for r in mine}, TYPE_ORDER)]
    out: dict[str, Any] = {}
    for other in CONTINUATIONS:
        theirs = of(other)
        if other == config or not theirs:
            continue
        by_task = {(r["split"], r["id"]): r for r in theirs}
        out[run_name(other, spec)] = {
            kind: difference(paired_rows([r for r in mine if kind in ("all", r["type"])], by_task))
            for kind in kinds
        }
    return out


def summarise(rows: list[dict[str, Any]], header: dict[str, Any] | None, tag: str) -> dict:
    ok = [r for r in rows if "error" not in r]
    runs: dict[str, Any] = {}
    known = list(NAMES)
    configs = sorted(
        {r["config"] for r in rows},
        key=lambda c: (c not in known, known.index(c) if c in known else 0, c),
    )
    specs = sorted({str(r["permutations"]) for r in rows}, key=lambda p: (p == "N", p.zfill(3)))
    for config in configs:
        for spec in specs:
            mine = [r for r in ok if r["config"] == config and str(r["permutations"]) == spec]
            failed = [
                r
                for r in rows
                if r["config"] == config and str(r["permutations"]) == spec and "error" in r
            ]
            if not mine and not failed:
                continue
            letters = None
            if config != "letters":
                letters = {
                    (r["split"], r["id"]): r
                    for r in ok
                    if r["config"] == "letters" and str(r["permutations"]) == spec
                }
            by: dict[str, Any] = {}
            for split in ["all", *_order({r["split"] for r in mine}, SPLIT_ORDER)]:
                in_split = [r for r in mine if split in ("all", r["split"])]
                by[split] = {
                    kind: cell([r for r in in_split if kind in ("all", r["type"])], letters)
                    for kind in ["all", *_order({r["type"] for r in in_split}, TYPE_ORDER)]
                }
            run: dict[str, Any] = {
                "config": config,
                "permutations": spec,
                "answered": len(mine),
                "failed": len(failed),
                "errors": sorted({r["error"] for r in failed})[:5],
                "copied": sum("copied_from" in r for r in mine),
                # Rows whose numbers predate the engine's (readouts_rows.ENGINE_NUMBERS).
                "older_numbers": sum(not numbers_current(r) for r in mine),
                "applied": dict(sorted(Counter(r["applied"] for r in mine).items())),
                "readouts_echoed": sorted({str(r.get("readout")) for r in mine}),
                "seconds_total": sum(r["seconds"] for r in mine),
                "load1_p50": percentile([r["load1"] for r in mine], 50),
                "by": by,
            }
            if config in CONTINUATIONS:
                run["vs_normalizations"] = vs_normalizations(ok, config, spec)
            runs[run_name(config, spec)] = run
    return {
        "tag": tag,
        "fingerprint": header,
        "cores": os.cpu_count(),
        "notes": NOTES,
        "runs": runs,
    }


def write_summary(rows_file: Path, out: Path, tag: str) -> Path:
    header, rows = read_rows(rows_file)
    out.write_text(json.dumps(summarise(list(rows.values()), header, tag), indent=1) + "\n")
    return out
