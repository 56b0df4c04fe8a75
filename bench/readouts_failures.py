"""Where the realistic model still fails: a section of docs/readouts.md from its rows
(bench/results/readouts-qwen2.5-1.5b.jsonl). Issue #35 asks that a goal not reached be reported
per split and per task family, with what the rows that still fail have in common.

The run shown is the most accurate one that answered every task (ties: the cheaper one), set
beside `letters@1`. Its failing rows are compared with its right ones on what the rows hold:
the prompt's length, the option count, the probability given to the prediction, and whether
the expected label came second. The issue's other goal, yes/no questions as accurate as
choices, is shown for the run shown and letters@1. Pure: reads rows, writes lines.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.readouts import PER_TYPE
from bench.readouts_rows import read_rows
from bench.readouts_stats import paired_bootstrap, percentile, wilson
from bench.readouts_summary import cell

REALISTIC = "qwen2.5-1.5b"
# What JevBench's hard families ask (read from its task files; no measurement).
HARD = (
    "The hard split asks for work that one answer token leaves no room for: arithmetic over "
    "dates, money and units (temporal_numeric: prorated credits, elapsed hours across time "
    "zones, TiB against GB), lookups chained through binders of about 10,000 characters with "
    "aliases, amendments and superseded drafts (multi_hop), and texts written to be misread "
    "(trap: a quoted request that is not the author's, a forecast banner beside the actual gate "
    "scan)."
)
TASKS = 231
# Issue #35's goal for the realistic model over all TASKS: 60 % right.
GOAL = 139
SPLITS = ("easy", "original", "hard")
# The splits a configuration by type was chosen on (bench/readouts.py PER_TYPE): the rest is
# held out.
DEV = ("easy", "original")


def _runs(rows: list[dict[str, Any]]) -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
    out: dict[str, dict[tuple[str, str], dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        if "error" not in r:
            out[f"{r['config']}@{r['permutations']}"][(r["split"], r["id"])] = r
    return dict(out)


def best_run(runs: dict[str, dict[tuple[str, str], dict[str, Any]]]) -> str | None:
    """The run with the most right answers among those that answered all TASKS; ties go to
    the one that took fewer seconds in all."""
    whole = {name: got for name, got in runs.items() if len(got) >= TASKS}
    if not whole:
        return None
    return max(
        whole,
        key=lambda n: (
            sum(bool(r["correct"]) for r in whole[n].values()),
            -sum(r["seconds"] for r in whole[n].values()),
        ),
    )


Runs = dict[str, dict[tuple[str, str], dict[str, Any]]]


def _best_one_order(runs: Runs, keep: Any, own_rows: bool) -> tuple[str, int, int] | None:
    """The one-order run of a single config with the most right answers over the rows `keep`
    takes (ties: fewer seconds), among those that answered all of them: (run, right, n). With
    `own_rows`, rows copied from a twin config do not count (the twin is the one to name)."""
    wanted = max((sum(map(keep, got.values())) for got in runs.values()), default=0)
    best: tuple[int, float, str, int] | None = None
    for name, got in runs.items():
        config, spec = name.rsplit("@", 1)
        if spec != "1" or config in PER_TYPE:
            continue
        mine = [r for r in got.values() if keep(r) and not (own_rows and "copied_from" in r)]
        if not mine or len(mine) < wanted:
            continue
        key = (sum(bool(r["correct"]) for r in mine), -sum(r["seconds"] for r in mine))
        if best is None or key > best[:2]:
            best = (*key, name, len(mine))
    return (best[2], best[0], best[3]) if best else None


def chosen_per_type(runs: Runs, splits: tuple[str, ...] = DEV) -> dict[str, tuple[str, int, int]]:
    """Per question type, the one-order run of a single config with the most right answers on
    `splits` (ties: fewer seconds there), among those that answered every such task with rows
    of their own: (run, right, n). What PER_TYPE's `per-type` was chosen by, so the page can
    say the rows still choose it."""
    out: dict[str, tuple[str, int, int]] = {}
    for kind in sorted({r["type"] for got in runs.values() for r in got.values()}):
        found = _best_one_order(
            runs, lambda r, k=kind: r["type"] == k and r["split"] in splits, own_rows=True
        )
        if found is not None:
            out[kind] = found
    return out


def _paired(runs: Runs, a: str, b: str, keys: list[tuple[str, str]]) -> str:
    """a against b over these tasks: the difference in right answers, paired, with its
    bootstrap 95 % interval."""
    both = [k for k in keys if k in runs[a] and k in runs[b]]
    diff = paired_bootstrap(
        [float(runs[a][k]["correct"]) for k in both], [float(runs[b][k]["correct"]) for k in both]
    )
    if diff is None:
        return "-"
    mean, lo, hi = diff
    return f"{100 * mean:+.1f} pt [{100 * lo:+.1f}, {100 * hi:+.1f}] (n={len(both)})"


def held_out(runs: Runs, name: str) -> list[str]:
    """For a run by question type: what chose it, and how it does on the tasks that did not
    (paired against letters and against the single run the same tasks would have chosen)."""
    config = name.rsplit("@", 1)[0]
    if config not in PER_TYPE or len(runs[name]) < TASKS:
        return []
    chosen = chosen_per_type(runs)
    said = ", ".join(f"{k} `{config_of}`" for k, config_of in PER_TYPE[config].items())
    found = ", ".join(f"{k} `{run}` ({right}/{n})" for k, (run, right, n) in chosen.items())
    same = all(chosen.get(k, ("",))[0] == f"{c}@1" for k, c in PER_TYPE[config].items())
    held = [k for k, r in runs[name].items() if r["split"] not in DEV]
    right = {n: sum(bool(got[k]["correct"]) for k in held if k in got) for n, got in runs.items()}
    single = _best_one_order(runs, lambda r: r["split"] in DEV, own_rows=False)
    whole = [n for n, got in runs.items() if n != name and all(k in got for k in held)]
    rival = max(whole, key=lambda n: right[n], default=None)
    rest = ", ".join(s for s in SPLITS if s not in DEV)
    text = (
        f"`{name}` asks each question type as another run does ({said}), chosen on the "
        f"{' and '.join(DEV)} splits alone: per type, the one-order run with the most right "
        f"answers there; these rows choose {found}"
        + (" (the same)." if same else ": no longer the same, so it is no longer what they choose.")
        + f" On the {len(held)} tasks that did not choose it ({rest}) it gets {right[name]}"
    )
    if "letters@1" in runs:
        versus = _paired(runs, name, "letters@1", held)
        text += f"; against `letters@1` ({right['letters@1']}): {versus}"
    if single is not None:
        text += (
            f"; against `{single[0]}` ({right[single[0]]}), the single one-order run that the "
            f"{' and '.join(DEV)} splits choose: {_paired(runs, name, single[0], held)}"
        )
    if rival is not None:
        text += (
            f". The best single run on those tasks, picked on them (so no fair rival, an upper "
            f"bound), is `{rival}` with {right[rival]}"
        )
    return [text + ". Its total over all tasks counts the tasks that chose it.", ""]


def _ranked_second(r: dict[str, Any]) -> bool:
    probs = sorted(r["probabilities"].values(), reverse=True)
    return len(probs) > 1 and r["p_expected"] == probs[1]


def traits(rows: list[dict[str, Any]], letters: dict[tuple[str, str], dict[str, Any]]) -> dict:
    """The failing rows against the right ones: counts and medians of what each row holds."""

    def describe(group: list[dict[str, Any]]) -> dict[str, Any]:
        also = [letters[(r["split"], r["id"])] for r in group if (r["split"], r["id"]) in letters]
        return {
            "n": len(group),
            "hard": sum(r["split"] == "hard" for r in group),
            "input_tokens_p50": percentile([r["input_tokens"] for r in group], 50),
            "options_p50": percentile([len(r["probabilities"]) for r in group], 50),
            "p_predicted_p50": percentile([r["p_predicted"] for r in group], 50),
            "second": sum(_ranked_second(r) for r in group if not r["correct"]),
            "letters_wrong": sum(not b["correct"] for b in also),
        }

    return {
        "failing": describe([r for r in rows if not r["correct"]]),
        "right": describe([r for r in rows if r["correct"]]),
    }


def _against(vs: dict[str, Any] | None) -> str:
    """The run's paired difference and cost against letters@1: the goal's stated cost."""
    if not vs or vs["difference"] is None:
        return ""
    lo, hi = vs["bootstrap95"]
    cost = vs["cost_ratio"]
    return (
        f" Against letters@1: {100 * vs['difference']:+.1f} pt [{100 * lo:+.1f}, {100 * hi:+.1f}]"
        f" (paired, n={vs['pairs']}), at "
        + (f"{cost:.2f}x its p50 latency." if cost is not None else "an unmeasured cost.")
    )


def _chance(got: dict[tuple[str, str], dict[str, Any]], keys: list[tuple[str, str]]) -> float:
    """What a uniform guess gets right over these tasks: one over each option count, summed."""
    return sum(1 / len(got[k]["probabilities"]) for k in keys)


def _count(got: dict[tuple[str, str], dict[str, Any]], keys: list[tuple[str, str]]) -> str:
    answered = [got[k] for k in keys if k in got]
    right = sum(bool(r["correct"]) for r in answered)
    if not answered:
        return "-"
    return str(right) if len(answered) == len(keys) else f"{right}/{len(answered)}"


def _share(k: int, n: int) -> str:
    return f"{k}/{n} ({100 * k / n:.0f} %)" if n else "-"


def _rate(rows: list[dict[str, Any]]) -> tuple[int, int, str]:
    """Right answers among these rows: (k, n, "k/n = x % [Wilson 95 %]"), written as
    readouts_docs._acc writes a run's accuracy (which imports this module, so not shared)."""
    k, n = sum(bool(r["correct"]) for r in rows), len(rows)
    if not n:
        return 0, 0, "-"
    lo, hi = wilson(k, n)
    return k, n, f"{k}/{n} = {100 * k / n:.1f} % [{100 * lo:.0f}, {100 * hi:.0f}]"


def yes_no_goal(runs: Runs, names: list[str]) -> list[str]:
    """Issue #35's other goal: on the same model, yes/no questions answered right at least as
    often as choices (the issue found the 1.5B leaning to "yes" on a set of its own, so that a
    "no" was seldom right). Per run named, over all splits and per split: yes/no against
    choices (different tasks, so each with its own interval, not paired), and the yes/no
    questions by the answer expected, where such a leaning shows. Equal rates meet the goal."""
    out = [
        "Issue #35's other goal: yes/no questions answered right at least as often as choices "
        "on the same model, judged per split on the rates (Wilson 95 % intervals beside them; "
        "different tasks, so not paired), and the yes/no questions by the answer expected, "
        "where a leaning to yes shows:",
        "",
        "| run | split | yes/no | choices | goal | expected yes | expected no |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        got = list(runs.get(name, {}).values())
        for split in ("all", *SPLITS):
            mine = [r for r in got if split == "all" or r["split"] == split]
            noul = [r for r in mine if r["type"] == "noul"]
            k_yn, n_yn, yes_no = _rate(noul)
            k_ch, n_ch, choices = _rate([r for r in mine if r["type"] == "choice"])
            if not n_yn and not n_ch:
                continue
            goal = "-"
            if n_yn and n_ch:  # the rates compared without division: k_yn/n_yn >= k_ch/n_ch
                goal = "reached" if k_yn * n_ch >= k_ch * n_yn else "not reached"
            by = [_rate([r for r in noul if r["expected"] == e])[2] for e in ("yes", "no")]
            out.append(f"| `{name}` | {split} | {yes_no} | {choices} | {goal} | {' | '.join(by)} |")
    return [*out, ""] if len(out) > 4 else []


def section(results: Path) -> list[str]:
    _, keyed = read_rows(results / f"readouts-{REALISTIC}.jsonl")
    runs = _runs(list(keyed.values()))
    name = best_run(runs)
    if name is None:
        return []
    best, letters = runs[name], runs.get("letters@1", {})
    right = sum(bool(r["correct"]) for r in best.values())
    vs = cell(list(best.values()), letters)["vs_letters"] if name != "letters@1" else None
    out = [
        f"## What {REALISTIC} still gets wrong",
        "",
        f"The most accurate run over all {TASKS} tasks is `{name}`: {right}/{len(best)}; the "
        f"goal of issue #35 is {GOAL}/{TASKS} (60 %): "
        + ("reached." if right >= GOAL else f"not reached, {GOAL - right} short.")
        + _against(vs)
        + " Per split and task family: what a uniform guess gets (one over the option count, "
        "summed) and the right answers of every run; `k/m`: the run answered m of the n tasks "
        "(a run asked in part), `-`: none.",
        "",
        f"| split | family | type | n | chance | {' | '.join(runs)} |",
        "|---|---|---|---|---|" + "---|" * len(runs),
    ]
    out[4:4] = held_out(runs, name)
    groups: dict[tuple[str, str, str], list[tuple[str, str]]] = defaultdict(list)
    for key, r in best.items():
        groups[(r["split"], r["family"], r["type"])].append(key)
    splits = SPLITS
    for split, family, kind in sorted(groups, key=lambda g: (splits.index(g[0]), g[1], g[2])):
        keys = groups[(split, family, kind)]
        chance = _chance(best, keys)
        cells = [_count(got, keys) for got in runs.values()]
        out.append(
            f"| {split} | {family} | {kind} | {len(keys)} | {chance:.1f} | {' | '.join(cells)} |"
        )
    out.append("")
    for split in splits:
        keys = [k for k, r in best.items() if r["split"] == split]
        chance = _chance(best, keys)
        mine = sum(bool(best[k]["correct"]) for k in keys)
        out.append(f"- {split}: {mine}/{len(keys)} right, {chance:.1f} by chance")
    t = traits(list(best.values()), letters)
    f, ok = t["failing"], t["right"]
    out += [
        "",
        f"What the {f['n']} failing rows of `{name}` have in common, against its {ok['n']} "
        "right ones:",
        "",
        f"- from the hard split: {_share(f['hard'], f['n'])}, against "
        f"{_share(ok['hard'], ok['n'])} of the right ones",
        f"- input tokens asked (every option order counted), median: "
        f"{f['input_tokens_p50']:,.0f} against "
        f"{ok['input_tokens_p50']:,.0f}; options, median: {f['options_p50']:g} against "
        f"{ok['options_p50']:g}",
        f"- probability of the predicted label, median: {f['p_predicted_p50']:.2f} against "
        f"{ok['p_predicted_p50']:.2f}",
        f"- the expected label ranked second: {_share(f['second'], f['n'])}",
        f"- letters@1 wrong on the same task: {_share(f['letters_wrong'], f['n'])}",
        "",
        HARD,
        "",
    ]
    return out + yes_no_goal(runs, list(dict.fromkeys(["letters@1", name])))
