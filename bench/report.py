"""`python -m bench.report`: benchmark tables from bench/results/*.json.

    python -m bench.report [TAG ...]   # the per-model tables, on stdout
    python -m bench.report --docs      # docs/benchmarks.md, its plots in docs/img/, README.md's
                                       # headline table and docs/sagemaker.md's autoscaling block
    python -m bench.report --docs --out DIR   # the same files under DIR (tests compare them)

The docs are generated so that they cannot drift from the results: each table names its files,
the date each file records and the commit (where recorded); ratios carry a paired bootstrap 95 %
interval where a file keeps each pair, accuracies a Wilson 95 % interval, and a target such as
"<= 1.05x" is called met only when the interval's upper bound is within it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench import concurrency, report_gpu
from bench.common import BOOTSTRAP, MIN_PAIRS, RESULTS, SEED
from bench.readouts_stats import median_interval


def load(suite: str, tag: str) -> dict[str, Any] | None:
    path = RESULTS / f"{suite}-{tag}.json"
    return json.loads(path.read_text()) if path.exists() else None


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def _fmt(probs: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in probs.items())


def _gap(g: dict[str, Any]) -> str:
    gap = g.get("probability_gap_vs_completion_max")
    if gap is None:
        return ""
    return f"; where all letters are there, probabilities differ by at most {gap:.0e}"


def rows(tag: str) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    if j := load("jevbench", tag):
        files = ", ".join(f"{k} {v['correct']}/{v['tasks']}" for k, v in j["per_file"].items())
        lat = j["latency_seconds"]
        out.append(
            (
                "JevBench via /v1/systemone",
                f"{j['correct']}/{j['tasks']} ({files})",
                f"p50 {ms(lat['p50'])}, p95 {ms(lat['p95'])}, max {ms(lat['max'])}; "
                f"ECE {j['ece']:.3f}; prompt tokens p50 {j['prompt_tokens']['p50']:.0f}",
            )
        )
    if g := load("generation", tag):
        out.append(
            (
                "Decision vs chat completion (option id, greedy)",
                f"chat / decision latency p50 **{g['chat_over_decision_p50']:.2f}x**",
                f"chat names the decision's argmax {g['chat_argmax_agreement']:.0%}, "
                f"names no option {g['chat_unparseable']:.0%} ({g['tasks']} tasks)",
            )
        )
        out.append(
            (
                "Decision vs llama-server `/completion` (same prompt, 1 token, top-10)",
                f"completion / decision latency p50 **{g['completion_over_decision_p50']:.2f}x**",
                f"same argmax {g['completion_argmax_agreement']:.0%}; some option letter "
                f"missing from the top-10 in {g['completion_missing_some_letter']:.0%} of tasks"
                + _gap(g),
            )
        )
    if r := load("order", tag):
        d, c = r["by_path"]["decision"], r["by_path"]["chat"]
        ex = r["routing_example"]
        p_ex = ", ".join(f"{run['p_expected']:.2f}" for run in ex["runs"])
        out.append(
            (
                "Option order: each item asked in every rotation of its options",
                f"decision accuracy {d['accuracy']:.0%}, first-listed option chosen "
                f"**{d['first_listed_share']:.0%}** (position-blind "
                f"{r['first_listed_share_if_position_blind']:.0%}); chat accuracy "
                f"{c['accuracy']:.0%}, first-listed {c['first_listed_share']:.0%}",
                f"{r['items']} items ({r['runs']} runs); same answer in every rotation: decision "
                f"{d['same_answer_in_every_rotation']:.0%}, chat "
                f"{c['same_answer_in_every_rotation']:.0%}; password-reset example "
                f"P(account_access) per rotation {p_ex}",
            )
        )
        out.append(
            (
                "Decision with `permutations: n` (every rotation, averaged)",
                f"accuracy **{r['permuted_accuracy']:.0%}** vs {d['accuracy']:.0%} in one order, "
                f"latency p50 **{r['permuted_over_single_p50']:.2f}x** of one order",
                f"p50 {ms(r['single_seconds']['p50'])} -> {ms(r['permuted_seconds']['p50'])}; "
                f"password-reset example {_fmt(ex['permuted'])}; equals the mean of the separate "
                f"rotations to {r['permuted_vs_client_mean_max']:.0e}",
            )
        )
    if o := load("overhead", tag):
        out.append(
            (
                "HTTP overhead (end to end / engine forward)",
                f"p50 **{o['ratio_p50']:.3f}** (target <= 1.10)",
                f"HTTP p50 {ms(o['http_seconds']['p50'])}, forward p50 "
                f"{ms(o['forward_seconds']['p50'])}",
            )
        )
    if s := load("shared", tag):
        r = s["decisions_per_s"]
        out.append(
            (
                "Shared state: 21 questions, one request vs 21",
                f"**{s['speedup_vs_cold_singles']:.2f}x** decisions/s vs cold singles "
                "(target >= 4x)",
                f"{r['shared']:.2f}/s shared, {r['singles_cold']:.2f}/s singles each paying "
                f"the prefill, {r['singles_reusing_prefix']:.2f}/s singles on a prefix the "
                f"server still holds ({s['speedup_vs_reusing_singles']:.2f}x); "
                f"{s['prompt_tokens_per_question']} tokens per question",
            )
        )
    if p := load("prefix", tag):
        out.append(
            (
                "Prefix cache: new question on a recently seen state",
                f"warm / cold p50 **{p['warm_over_cold_p50']:.2f}** (target <= 0.3)",
                f"{p['state_tokens']}-token state: cold {ms(p['cold_seconds']['p50'])}, "
                f"warm {ms(p['warm_seconds']['p50'])}",
            )
        )
    if c := load("scaling", tag):
        lengths = ", ".join(
            f"{v['tokens']} tok {v['seconds']:.1f} s" for v in c["by_state_length"].values()
        )
        options = ", ".join(f"{k}: {v['seconds']:.2f} s" for k, v in c["by_options"].items())
        clients = ", ".join(
            f"{k}: {v['decisions_per_s']:.2f}/s" for k, v in c["by_clients"].items()
        )
        mem = c["memory_kb"]
        memory = "; ".join(
            f"{k} PSS {v['pss'] / 1024:.0f} MiB (RSS {v['rss'] / 1024:.0f}, "
            f"peak {v['peak_rss'] / 1024:.0f})"
            for k, v in mem.items()
        )
        out.append(("Latency vs state length (cold)", lengths, ""))
        out.append(("Latency vs options (prefix held)", options, ""))
        out.append(("Decisions/s vs concurrent clients", clients, ""))
        out.append(("Memory after the run", memory, ""))
    return out


def _cpu(cpu: dict[str, Any] | None) -> str:
    if not cpu:
        return "1 + 1 (older run)"
    threads = f"{cpu.get('engine_threads', '?')} + {cpu.get('llama_server_threads', '?')}"
    return f"{cpu.get('sharing', '?')}, {threads}"


def _side(tag: str) -> dict[str, str]:
    """One model's column of the side-by-side table: its headline numbers, by row name."""
    out: dict[str, str] = {}
    if j := load("jevbench", tag):
        files = ", ".join(f"{k} {v['correct']}/{v['tasks']}" for k, v in j["per_file"].items())
        out["JevBench via /v1/systemone"] = f"{j['correct']}/{j['tasks']} ({files})"
        out["JevBench latency p50 / p95"] = (
            f"{ms(j['latency_seconds']['p50'])} / {ms(j['latency_seconds']['p95'])}"
        )
        out["JevBench calibration (ECE)"] = f"{j['ece']:.3f}"
    if g := load("generation", tag):
        out["chat's reply names the decision's top option"] = (
            f"{g['chat_argmax_agreement']:.0%} (no option named: {g['chat_unparseable']:.0%})"
        )
        out["`/completion` top-10 misses an option letter"] = (
            f"{g['completion_missing_some_letter']:.0%} of tasks"
        )
        out["`/completion` / decision latency p50"] = f"{g['completion_over_decision_p50']:.2f}x"
    if order := load("order", tag):
        d = order["by_path"]["decision"]
        blind = order["first_listed_share_if_position_blind"]
        out["first-listed option chosen (position-blind)"] = (
            f"{d['first_listed_share']:.0%} ({blind:.0%})"
        )
        out["accuracy one order -> `permutations: n`"] = (
            f"{d['accuracy']:.0%} -> {order['permuted_accuracy']:.0%} "
            f"({order['permuted_over_single_p50']:.2f}x latency)"
        )
    if o := load("overhead", tag):
        out["HTTP overhead p50 (target <= 1.10)"] = f"{o['ratio_p50']:.3f}"
    if s := load("shared", tag):
        out["shared state vs cold singles (target >= 4x)"] = f"{s['speedup_vs_cold_singles']:.2f}x"
    if p := load("prefix", tag):
        out["prefix cache warm / cold (target <= 0.3)"] = (
            f"{p['warm_over_cold_p50']:.2f} ({ms(p['cold_seconds']['p50'])} -> "
            f"{ms(p['warm_seconds']['p50'])})"
        )
    if f := load("floor", tag):
        out["decision / llama-server floor (target <= 1.05)"] = ", ".join(
            f"{v['forward_over_floor']:.2f}x at {v['prompt_tokens']:,.0f}"
            for v in f["lengths"].values()
        )
    if c := load("scaling", tag):
        for n, v in c["by_state_length"].items():  # the tokenizers differ: the cell says
            out[f"cold decision, ~{int(n):,}-token state"] = (
                f"{v['seconds']:.1f} s ({v['tokens']:,} tokens)"
            )
        if c["by_clients"]:
            n, best = max(c["by_clients"].items(), key=lambda kv: kv[1]["decisions_per_s"])
            out["decisions/s, best of 1-8 clients (prefix held)"] = (
                f"{best['decisions_per_s']:.2f} ({n} clients)"
            )
        out["memory PSS, " + " + ".join(c["memory_kb"])] = (
            " + ".join(f"{v['pss'] / 1024:,.0f}" for v in c["memory_kb"].values()) + " MiB"
        )
    # What each number ran with: the machine (the VM behind these runs has changed between
    # sessions) and the server's CPU settings; older files (1 thread per process) have none.
    runs = {"jevbench": j, "generation": g, "order": order, "overhead": o, "shared": s}
    runs.update(prefix=p, floor=f, scaling=c)
    groups: dict[str, list[str]] = {}
    for suite, r in runs.items():
        if r:
            machine = r.get("machine", {}).get("cpu", "?").replace("(R)", "")
            machine = " ".join(machine.split()[:2])  # "Intel Xeon", "AMD EPYC"
            groups.setdefault(f"{machine}, {_cpu(r.get('server_cpu'))}", []).append(suite)
    if groups:
        out["CPU; CPU sharing, threads engine + llama-server"] = "; ".join(
            f"{k} ({', '.join(v)})" for k, v in sorted(groups.items())
        )
    return out


def side_by_side(tags: list[str]) -> list[str]:
    """The models next to each other, one column each ("—": not run for that model)."""
    columns = [_side(tag) for tag in tags]
    names: list[str] = []
    for col in columns:
        names += [n for n in col if n not in names]
    lines = ["| | " + " | ".join(tags) + " |", "|---" * (len(tags) + 1) + "|"]
    lines += [f"| {n} | " + " | ".join(col.get(n, "—") for col in columns) + " |" for n in names]
    return lines


# ---------------------------------------------------------------------------------------------
# The generated docs: docs/benchmarks.md, docs/img/*.png, README.md's headline table and
# docs/sagemaker.md's autoscaling block.

MODELS = {
    "smollm2": "SmolLM2-135M",
    "qwen2.5-0.5b": "Qwen2.5-Coder-0.5B",
    "qwen2.5-1.5b": "Qwen2.5-Coder-1.5B",
}
Z95 = 1.959963984540054
PAGE = Path("docs/benchmarks.md")
IMG = Path("docs/img")
README_FILE = Path("README.md")
SAGEMAKER_PAGE = Path("docs/sagemaker.md")
BENCH_BEGIN = "<!-- bench:begin (generated by python -m bench.report --docs) -->"
BENCH_END = "<!-- bench:end -->"
SCALE_BEGIN = "<!-- autoscaling:begin (generated by python -m bench.report --docs) -->"
SCALE_END = "<!-- autoscaling:end -->"
# Files this report reads no table from, and why (the page lists them, and any other file
# it does not read, so that nothing in bench/results goes unmentioned).
NOT_SHOWN = {
    "mixed-smollm2-round100.json": "CPU sharing `slice` against the gate: `slice` was removed",
    "mixed_rounds-mixed-dynamic-split-gap3-qwen2.5-0.5b-ubatch128-no-preemption.json": (
        "a variant without preemption, which the engine no longer runs"
    ),
    "floor-200-qwen2.5-0.5b-build-0966ec6.json": "the floor on an earlier build (commit 0966ec6)",
}


def wilson(k: int, n: int) -> tuple[float, float]:
    """The Wilson score 95 % interval of a proportion k/n."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    d = 1 + Z95**2 / n
    centre = (p + Z95**2 / (2 * n)) / d
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / d
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_ratio(num: list[float], den: list[float]) -> tuple[float, float | None, float | None]:
    """median(num) / median(den) and its paired bootstrap 95 % interval (pairs resampled);
    no interval under MIN_PAIRS pairs."""
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    point = float(np.median(a) / np.median(b))
    if len(a) < MIN_PAIRS:
        return point, None, None
    rng = np.random.default_rng(SEED)
    idx = rng.integers(0, len(a), size=(BOOTSTRAP, len(a)))
    ratios = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return point, float(lo), float(hi)


def fx(point: float, lo: float | None = None, hi: float | None = None, n: int = 0) -> str:
    """A ratio with its interval, or why it has none (n: the pairs there are)."""
    if lo is None or hi is None:
        why = f"{n} pairs" if n else "one run"
        return f"{point:.2f}x (no interval: {why})"
    return f"{point:.2f}x [{lo:.2f}, {hi:.2f}]"


def fp(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k / n:.0%} ({k}/{n}) [{lo:.0%}, {hi:.0%}]"


def claim(hi: float | None, target: float) -> str:
    """A target (a ratio at most `target`) stated only where the interval supports it."""
    if hi is None:
        return "no claim without an interval"
    if hi <= target:
        return f"meets <= {target:.2f}x"
    return f"no claim: the interval reaches {hi:.2f}x"


def _read(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def _stamp(name: str, data: dict[str, Any]) -> str:
    machine = data.get("machine", {})
    date = machine.get("date") or "no date recorded"
    commit = data.get("commit") or machine.get("commit")
    cpu = " ".join(machine.get("cpu", "?").replace("(R)", "").split()[:2])
    where = f"{cpu}, {machine.get('cores', '?')} cores"
    return f"`{name}` ({date}; {where}" + (f"; commit {commit})" if commit else ")")


class Sources:
    """The files a table reads, for its source line."""

    def __init__(self) -> None:
        self.used: list[tuple[str, dict[str, Any]]] = []
        self.all_used: set[str] = set()

    def get(self, name: str) -> dict[str, Any] | None:
        data = _read(name)
        if data is not None:
            self.used.append((name, data))
            self.all_used.add(name)
        return data

    def brief(self) -> str:
        """One short line for the README: the dates, machines and commits of the files."""
        dates = sorted(d["machine"]["date"] for _, d in self.used if d["machine"].get("date"))
        undated = sum(1 for _, d in self.used if not d["machine"].get("date"))
        cpus = sorted({_stamp(n, d).split("; ")[-1].rstrip(")") for n, d in self.used})
        commits = sorted({c for _, d in self.used if (c := d.get("commit"))})
        self.used = []
        when = f"run {dates[0][:10]} to {dates[-1][:10]}" if dates else "no dates recorded"
        if undated:
            when += f" ({undated} files record no date)"
        made = f"commits {', '.join(commits)}" if commits else "no commit recorded"
        return f"From `bench/results/` ({when}; {'; '.join(cpus)}; {made})."

    def line(self) -> str:
        if not self.used:
            return ""
        stamps = "; ".join(_stamp(n, d) for n, d in self.used)
        commits = any(d.get("commit") or d.get("machine", {}).get("commit") for _, d in self.used)
        self.used = []
        tail = "" if commits else " No commit is recorded in these files."
        return f"Data: {stamps}.{tail}"


def load_range(values: list[float]) -> str:
    """The 1-minute load averages a run recorded, as a range ("—": none recorded)."""
    return f"{min(values):.1f}-{max(values):.1f}" if values else "—"


def busy(values: list[float], cores: int = 2) -> str:
    """A note for a headline cell where other work shared the cores during the run."""
    return (
        f"; load average up to {max(values):.1f} on {cores} cores"
        if values and max(values) > cores
        else ""
    )


def _floor_loads(f: dict[str, Any]) -> list[float]:
    load = f.get("load_average") or {}
    return [v[0] for v in (load.get("start"), load.get("end")) if v]


def _concurrency_loads(c: dict[str, Any]) -> list[float]:
    load = c.get("load_average") or {}
    return [x[0] for x in [load.get("start"), *load.get("rounds", [])] if x]


def _tags(src: Sources, suite: str) -> list[str]:
    return [t for t in MODELS if (RESULTS / f"{suite}-{t}.json").exists()]


def headline(src: Sources) -> list[str]:
    """Ratios and accuracies, one column per model."""
    rows: dict[str, dict[str, str]] = {}

    def put(row: str, tag: str, text: str) -> None:
        rows.setdefault(row, {})[tag] = text

    for tag in MODELS:
        if f := src.get(f"floor-200-{tag}.json"):
            v = next(iter(f["lengths"].values()))
            p, lo, hi = paired_ratio(v["forward_seconds_all"], v["floor_seconds_all"])
            note = claim(hi, f.get("target_ratio", 1.05))
            layout = v.get("floor_layout")
            put(
                "decision / llama-server (its faster layout), same ~200-token prompt",
                tag,
                f"{fx(p, lo, hi)}, {note} ({v['repeats']} pairs, "
                + (f"`{layout}`" if layout else "the proxy's own llama-server")
                + busy(_floor_loads(f), f["machine"].get("cores", 2))
                + ")",
            )
        if cc := src.get(f"concurrency-{tag}.json"):
            cs = concurrency.summarise(cc)
            d = cs["decisions_ratio"]
            put(
                "decisions/s under concurrent clients, proxy / stock llama-server with as many "
                "slots",
                tag,
                f"{fx(d['point'], d['lo'], d['hi'], d['n'])} ({cc['clients']} clients, "
                f"`{cs['reference'].removeprefix('stock-')}`"
                + busy(_concurrency_loads(cc), cc["machine"].get("cores", 2))
                + ")",
            )
        if g := src.get(f"generation-{tag}.json"):
            r = g["rows"]
            p, lo, hi = paired_ratio(
                [x["completion_seconds"] for x in r], [x["decision_seconds"] for x in r]
            )
            put(f"llama-server `/completion` / decision ({len(r)} tasks)", tag, fx(p, lo, hi))
        if o := src.get(f"order-{tag}.json"):
            r = o["rows"]
            p, lo, hi = paired_ratio(
                [x["permuted_seconds"] for x in r], [x["single_seconds"] for x in r]
            )
            put(f"`permutations: n` / one order, latency ({len(r)} items)", tag, fx(p, lo, hi))
        if s := src.get(f"shared-{tag}.json"):
            put(
                "one shared request / 21 cold single requests, decisions/s",
                tag,
                f"{s['speedup_vs_cold_singles']:.2f}x (no interval: one run)",
            )
        if pc := src.get(f"prefix-{tag}.json"):
            put(
                "new question on a recent state, warm / cold",
                tag,
                f"{pc['warm_over_cold_p50']:.2f}x (no interval: one run)",
            )
        if ov := src.get(f"overhead-{tag}.json"):
            put(
                "HTTP end to end / engine forward pass",
                tag,
                f"{ov['ratio_p50']:.3f}x (no interval: one run)",
            )
        if j := src.get(f"jevbench-{tag}.json"):
            put("JevBench accuracy (System One)", tag, fp(j["correct"], j["tasks"]))
        if o:
            r = o["rows"]
            k = sum(x["permuted_argmax"] == x["expected"] for x in r)
            put("option-order suite: `permutations: n` accuracy", tag, fp(k, len(r)))
    lines = [
        "| | " + " | ".join(MODELS.values()) + " |",
        "|---" * (len(MODELS) + 1) + "|",
    ]
    for row, cells in rows.items():
        lines.append(f"| {row} | " + " | ".join(cells.get(t, "—") for t in MODELS) + " |")
    return lines


def _floor(src: Sources) -> list[str]:
    out = [
        "## A decision against llama-server's own prompt processing",
        "",
        "The floor: a stock llama-server's `/completion` timing of the same prompt, one token "
        "predicted, prompt cache off, on the same machine (`bench/floor.py`), in both weight "
        "layouts (`repack`, llama.cpp's default, and `no-repack`), each its own process, "
        "measured in turn after every decision; each row is measured against the faster layout "
        "(by median), the machine's best. Files without a layout are older runs, measured "
        "against the proxy's own llama-server. The ratio is of the medians (the engine's "
        "forward pass / llama-server's prompt time); its interval resamples the pairs.",
        "",
        "| model | prompt tokens | pairs | decision p50 | llama-server p50 (faster layout) | "
        "other layout p50 | ratio [95 % CI] | target | load average |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for tag, label in MODELS.items():
        for name in (f"floor-200-{tag}.json", f"floor-{tag}.json"):
            f = src.get(name)
            if not f:
                continue
            for v in f["lengths"].values():
                p, lo, hi = paired_ratio(v["forward_seconds_all"], v["floor_seconds_all"])
                layout = v.get("floor_layout")
                others = {
                    k: x for k, x in v.get("floor_seconds_by_layout", {}).items() if k != layout
                }
                other = ", ".join(f"{x:.2f} s (`{k}`)" for k, x in others.items()) or "—"
                out.append(
                    f"| {label} | {v['prompt_tokens']:,.0f} | {v['repeats']} | "
                    f"{v['decision_forward_seconds']:.2f} s | {v['floor_seconds']:.2f} s "
                    + (f"(`{layout}`)" if layout else "(the proxy's own)")
                    + f" | {other} | {fx(p, lo, hi, v['repeats'])} | "
                    f"{claim(hi, f.get('target_ratio', 1.05))} | "
                    f"{load_range(_floor_loads(f))} |"
                )
    out += [
        "",
        "Load average: the 1-minute load average at the start and end of the run, where the file "
        "records it (2 cores: above 2, other work shared the machine and the times carry it).",
        "",
        src.line(),
        "",
        "![latency against the floor](img/floor.png)",
        "",
    ]
    return out


def _concurrency(src: Sources) -> list[str]:
    tags = _tags(src, "concurrency")
    if not tags:
        return []
    out = [
        "## Concurrent clients: the proxy against a stock llama-server",
        "",
        "`concurrency` (`bench/concurrency.py`): N clients send M distinct decisions a round "
        "(each client takes the next once its last is answered; a new state for every prompt of "
        "every round) to the proxy's `/v1/decisions`, as a default server runs, and to a stock "
        "llama-server started with `--parallel N`, asked for the same prompt text as "
        "`/completion`, one token predicted with the top log-probabilities; then each client "
        "asks each side for one short chat completion (EOS ignored: every answer as long). The "
        "sides alternate within the run (A B, B A, ...). The stock server runs in the weight "
        "layout a default server runs on the machine, or in both (then the proxy is compared "
        "with the faster). A rate is the work done per second of busy time (each request's "
        "share of the time: the integral over its span of 1 / requests in flight); its 95 % "
        "interval is a bootstrap of the requests (all rounds pooled, so it carries how this "
        "run's decisions and rounds differ, not how another day's run would); the ratio pairs "
        "each prompt with itself on the other side.",
        "",
        "| model | clients; prompts x rounds | prompt tokens p50 | proxy decisions/s | stock "
        "llama-server decisions/s | proxy / stock | proxy chat tokens/s | stock chat tokens/s "
        "| chat proxy / stock | load average |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for tag in tags:
        c = src.get(f"concurrency-{tag}.json")
        assert c is not None
        s = concurrency.summarise(c)
        d, ch = s["decisions_per_s"], s["chat_tokens_per_s"]

        def stock(rates: dict[str, Any], ref: str, digits: int) -> str:
            return "; ".join(
                f"{concurrency.fmt_rate(v, digits)} (`{name.removeprefix('stock-')}`"
                + (", compared" if name == ref and len(rates) > 2 else "")
                + ")"
                for name, v in rates.items()
                if name != concurrency.PROXY
            )

        def ratio(r: dict[str, Any] | None) -> str:
            return fx(r["point"], r["lo"], r["hi"], r["n"]) if r else "—"

        loads = _concurrency_loads(c)
        chat_ref = s.get("chat_reference", "")
        out.append(
            f"| {MODELS[tag]} | {c['clients']}; {c['prompts_per_round']} x {c['rounds']} | "
            f"{s['prompt_tokens']['p50']:,.0f} | {concurrency.fmt_rate(d['proxy'])} | "
            f"{stock(d, s['reference'], 3)} | {ratio(s['decisions_ratio'])} | "
            + (concurrency.fmt_rate(ch["proxy"], 1) if ch else "—")
            + f" | {stock(ch, chat_ref, 1) if ch else '—'} | {ratio(s.get('chat_ratio'))} | "
            f"{load_range(loads)} |"
        )
    out += [
        "",
        "Load average: the 1-minute load average at the start and after each round (2 cores: "
        "above 2, other work shared the machine).",
        "",
        src.line(),
        "",
    ]
    return out


def _split(src: Sources) -> list[str]:
    tags = _tags(src, "split")
    if not tags:
        return []
    out = [
        "In one engine, with no server (`split`): a decision as served (a new state decoded in "
        "the same calls as its first question), the old way (the state's prefix, then the "
        "question), and the whole prompt in one call; p50 of 8 prompts each, on fresh states. "
        "The file keeps summaries only: no interval.",
        "",
        "| model | prompt tokens | as served / one call | prefix then question / one call |",
        "|---|---|---|---|",
    ]
    for t in tags:
        d = src.get(f"split-{t}.json")
        assert d is not None
        for v in d["lengths"].values():
            out.append(
                f"| {MODELS[t]} | {v['prompt_tokens']:,} | {v['split_over_one_call']:.2f}x | "
                f"{v['two_calls_over_one_call']:.2f}x |"
            )
    return [*out, "", src.line(), ""]


def _accuracy(src: Sources) -> list[str]:
    out = [
        "## Accuracy",
        "",
        "JevBench through `POST /v1/systemone`, every task of the files named (`bench/suites.py`"
        "); one option order, the defaults but for the bias correction (none: these rows predate "
        "the yes/no default, [readouts.md](readouts.md) measures it). Intervals: Wilson 95 %.",
        "",
        "| model | all | per file | ECE | latency p50 / p95 |",
        "|---|---|---|---|---|",
    ]
    for tag, label in MODELS.items():
        j = src.get(f"jevbench-{tag}.json")
        if not j:
            continue
        files = ", ".join(f"{k} {fp(v['correct'], v['tasks'])}" for k, v in j["per_file"].items())
        lat = j["latency_seconds"]
        out.append(
            f"| {label} | {fp(j['correct'], j['tasks'])} | {files} | {j['ece']:.3f} | "
            f"{lat['p50']:.2f} s / {lat['p95']:.2f} s |"
        )
    out += [
        "",
        src.line(),
        "",
        "The option-order suite (`bench/suites.py`, `order`): each item asked in every cyclic "
        "rotation of its options. One order: every rotation's answer scored (the rotations of "
        "one item are not independent, so that interval is narrower than it should be); "
        "`permutations: n`: one answer per item, the mean over its rotations.",
        "",
        "| model | one order: accuracy | first-listed option chosen (position-blind) | "
        "`permutations: n`: accuracy | latency, `permutations: n` / one order |",
        "|---|---|---|---|---|",
    ]
    for tag, label in MODELS.items():
        o = src.get(f"order-{tag}.json")
        if not o:
            continue
        r = o["rows"]
        runs = [(x, run) for x in r for run in x["runs"]]
        k1 = sum(run["decision_argmax"] == x["expected"] for x, run in runs)
        first = sum(run["decision_argmax"] == run["first_listed"] for _, run in runs)
        kp = sum(x["permuted_argmax"] == x["expected"] for x in r)
        p, lo, hi = paired_ratio(
            [x["permuted_seconds"] for x in r], [x["single_seconds"] for x in r]
        )
        blind = o["first_listed_share_if_position_blind"]
        out.append(
            f"| {label} | {fp(k1, len(runs))} | {first / len(runs):.0%} ({blind:.0%}) | "
            f"{fp(kp, len(r))} | {fx(p, lo, hi)} |"
        )
    out += [
        "",
        src.line(),
        "",
        "![accuracy per model](img/accuracy.png)",
        "",
        "Asking the chat endpoint for the option id instead (`bench/suites.py`, `generation`; "
        "greedy, the same tasks), and llama-server's `/completion` top-10 log-probabilities:",
        "",
        "| model | chat names the decision's top option | chat names no option | "
        "`/completion` top-10 lacks an option letter | `/completion` / decision latency |",
        "|---|---|---|---|---|",
    ]
    for tag, label in MODELS.items():
        g = src.get(f"generation-{tag}.json")
        if not g:
            continue
        n = g["tasks"]
        r = g["rows"]
        p, lo, hi = paired_ratio(
            [x["completion_seconds"] for x in r], [x["decision_seconds"] for x in r]
        )
        out.append(
            f"| {label} | {fp(round(g['chat_argmax_agreement'] * n), n)} | "
            f"{fp(round(g['chat_unparseable'] * n), n)} | "
            f"{fp(round(g['completion_missing_some_letter'] * n), n)} | {fx(p, lo, hi)} |"
        )
    out += ["", src.line(), ""]
    return out


def _prior(src: Sources) -> list[str]:
    out = [
        "## Position prior against `permutations: n`",
        "",
        "`bench/prior.py`: a prior fitted out of fold on half the tasks (no labels) answers the "
        "other half in one pass. Accuracy in the request's order (per task) and over every "
        "rotation (per run); latency ratio of the tasks where both requests were cold, pairs "
        "resampled. The goal (recover 70 % of the `permutations: n` gain at <= 1.1x one pass) "
        "is the file's own verdict.",
        "",
        "| model | path | accuracy, request order | accuracy, every rotation | first-listed | "
        "ECE | latency / one pass |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {"one_pass": "one pass", "one_pass_prior": "one pass + prior"}
    names["permutations_n"] = "`permutations: n`"
    verdicts = []
    for tag, label in MODELS.items():
        pr = src.get(f"prior-{tag}.json")
        if not pr:
            continue
        # One pass and one pass + prior ran side by side on one server: their pairs are in the
        # file. `permutations: n` was paired with a one pass on another server, not kept.
        cold = [x for x in pr["rows"] if not any(x["prefix_reused_tokens"][:2])]
        for i, (key, name) in enumerate(names.items()):
            b, rot = pr["by_path"][key], pr["over_every_rotation"][key]
            runs = pr["over_every_rotation"]["runs"]
            ratio = "—"
            if i == 1:
                pair = paired_ratio(
                    [x["seconds"][1] for x in cold], [x["seconds"][0] for x in cold]
                )
                ratio = fx(*pair, len(cold))
            elif i == 2:
                ratio = (
                    f"{pr['permutations_latency_ratio_p50']:.2f}x (no interval: its pairs, with "
                    "a one pass on another server, are not in the file)"
                )
            out.append(
                f"| {label} | {name} | {fp(b['correct'], pr['tasks'])} | {fp(rot['correct'], runs)}"
                f" | {b['first_listed']:.0%} | {b['ece']:.3f} | {ratio} |"
            )
        share = pr.get("recovered_share")
        share_text = "no gain to recover" if share is None else f"{share:.0%} of the gain"
        verdicts.append(f"{label}: {share_text}, goal {'met' if pr['goal_met'] else 'not met'}")
    out += ["", "; ".join(verdicts) + ".", "", src.line(), ""]
    return out


def _shared(src: Sources) -> list[str]:
    out = [
        "## Shared state and the prefix cache",
        "",
        "21 questions on one ~740-token state: one request with all of them, 21 single requests "
        "on a state the server still holds, 21 cold single requests (`shared`); a new question "
        "on a ~1,300-token state seen moments before, against the same state cold (`prefix`). "
        "The files keep medians of 3 repeats only: no interval.",
        "",
        "| model | shared, decisions/s | singles on a held state | cold singles | shared / cold "
        "| prefix cache: warm / cold p50 |",
        "|---|---|---|---|---|---|",
    ]
    for tag, label in MODELS.items():
        s, p = src.get(f"shared-{tag}.json"), src.get(f"prefix-{tag}.json")
        if not s:
            continue
        d = s["decisions_per_s"]
        warm = "—"
        if p:
            warm = (
                f"{p['warm_over_cold_p50']:.2f} ({p['cold_seconds']['p50']:.2f} s -> "
                f"{p['warm_seconds']['p50']:.2f} s)"
            )
        out.append(
            f"| {label} | {d['shared']:.2f} | {d['singles_reusing_prefix']:.2f} | "
            f"{d['singles_cold']:.2f} | {s['speedup_vs_cold_singles']:.2f}x | {warm} |"
        )
    out += ["", src.line(), "", "![shared state against cold requests](img/shared.png)", ""]
    return out


def _scaling(src: Sources) -> list[str]:
    out = [
        "## Latency, throughput and memory",
        "",
        "`scaling`: cold decisions by state length (each its own opening, nothing reused), "
        "decisions on a held state by option count, decisions/s by concurrent clients (on a "
        "held state), and memory (PSS) after the run. Single runs: no interval.",
        "",
    ]
    tags = _tags(src, "scaling")
    data = {t: src.get(f"scaling-{t}.json") for t in tags}
    lengths = list(next(iter(data.values()))["by_state_length"]) if data else []
    out += ["| cold decision | " + " | ".join(MODELS[t] for t in tags) + " |"]
    out += ["|---" * (len(tags) + 1) + "|"]
    for n in lengths:
        cells = [
            f"{data[t]['by_state_length'][n]['seconds']:.1f} s "
            f"({data[t]['by_state_length'][n]['tokens']:,} tokens)"
            for t in tags
        ]
        out.append(f"| ~{int(n):,}-token state | " + " | ".join(cells) + " |")
    options = list(next(iter(data.values()))["by_options"]) if data else []
    for n in options:
        cells = [f"{data[t]['by_options'][n]['seconds']:.2f} s" for t in tags]
        out.append(f"| {n} options, state held | " + " | ".join(cells) + " |")
    clients = list(next(iter(data.values()))["by_clients"]) if data else []
    for n in clients:
        cells = [f"{data[t]['by_clients'][n]['decisions_per_s']:.2f}/s" for t in tags]
        out.append(f"| decisions/s, {n} client{'s' * (n != '1')} | " + " | ".join(cells) + " |")
    for proc in ("proxy", "llama_server", "llama_server_split"):
        cells = [
            f"{data[t]['memory_kb'][proc]['pss'] / 1024:,.0f} MiB"
            if proc in data[t]["memory_kb"]
            else "—"
            for t in tags
        ]
        out.append(f"| memory PSS, {proc} | " + " | ".join(cells) + " |")
    out += ["", src.line(), ""]
    over = [
        f"{MODELS[t]} {o['ratio_p50']:.3f}x (HTTP p50 {o['http_seconds']['p50'] * 1000:,.0f} ms)"
        for t in MODELS
        if (o := src.get(f"overhead-{t}.json"))
    ]
    out += [
        "HTTP overhead, end to end / the engine's forward pass, p50 of 30 requests (the file "
        "keeps summaries only: no interval): " + "; ".join(over) + ".",
        "",
        src.line(),
        "",
    ]
    return out


def _options(src: Sources) -> list[str]:
    tags = _tags(src, "options")
    data = {t: src.get(f"options-{t}.json") for t in tags}
    if not data:
        return []
    sizes = list(next(iter(data.values()))["latency"])
    out = [
        "## Options: 2 to 255",
        "",
        "One decision per size on a fresh state (`bench/options.py`), p50 of 3; past 26 options "
        "the labels are numbers.",
        "",
        "| options | " + " | ".join(sizes) + " |",
        "|---" * (len(sizes) + 1) + "|",
    ]
    for t, d in data.items():
        lat = d["latency"]
        out.append(
            f"| {MODELS[t]}: prompt tokens | "
            + " | ".join(f"{lat[n]['prompt_tokens']:,}" for n in sizes)
            + " |"
        )
        out.append(
            f"| {MODELS[t]}: decision p50 | "
            + " | ".join(f"{lat[n]['seconds']['p50']:.2f} s" for n in sizes)
            + " |"
        )
    out += ["", src.line(), ""]
    out += [
        "Letters against numbers on the same questions (`labels`), accuracy [Wilson 95 %]:",
        "",
        "| model | letters, 8 | numbers, 8 | letters, 26 | numbers, 26 |",
        "|---|---|---|---|---|",
    ]
    for t in MODELS:
        d = src.get(f"labels-{t}.json") or src.get(f"options-{t}.json")
        if not d or not d.get("labels"):
            continue
        cells = []
        for n in ("8", "26"):
            for scheme in ("auto", "numbers"):
                v = d["labels"][scheme][n]
                cells.append(fp(round(v["accuracy"] * v["items"]), v["items"]))
        out.append(f"| {MODELS[t]} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
    out += ["", src.line(), ""]
    return out


ROUND_GOALS = {("decisions", "decision_p50"): 1.10}


def _cpu_sharing(src: Sources) -> list[str]:
    out = [
        "## CPU sharing: `dynamic` against `split` and the single-path optimum",
        "",
        "`mixed_rounds`: one phase on a fresh server of each design, four rounds, the order "
        "alternating; each ratio is the first design over the second, per round. Four rounds are "
        "too few for an interval: the rounds are shown, and no target is called met.",
        "",
        "| file | phase | ratio | median of rounds | rounds |",
        "|---|---|---|---|---|",
    ]
    files = sorted(p.name for p in RESULTS.glob("mixed_rounds-*.json"))
    for name in files:
        if name in NOT_SHOWN:
            continue
        m = src.get(name)
        assert m is not None
        a, b = m["designs"]
        gap = f", chat gap {m['chat_gap_seconds']:.0f} s" if m.get("chat_gap_seconds") else ""
        for key, rounds in m["ratios"].items():
            p, lo, hi = median_interval(rounds)
            text = fx(p, lo, hi, len(rounds)).replace("pairs", "rounds")
            goal = ROUND_GOALS.get((m["phase"], key))
            if goal and hi is not None:
                text += f", {claim(hi, goal)}"
            out.append(
                f"| `{name}` | {m['phase']}{gap} | {a} / {b}: {key.replace('_', ' ')} | {text} | "
                + ", ".join(f"{r:.2f}" for r in rounds)
                + " |"
            )
    out += ["", src.line(), ""]
    single = [t for t in MODELS if (RESULTS / f"mixed-{t}.json").exists()]
    if single:
        out += [
            "Single runs of every design, 30 s phases (`mixed`; no interval: one run):",
            "",
            "| model | design | decisions alone p50 | chat alone tok/s per stream | mixed: "
            "decisions/s | mixed: chat first token p50 | mixed: chat tok/s in all |",
            "|---|---|---|---|---|---|---|",
        ]
        for t in single:
            m = src.get(f"mixed-{t}.json")
            assert m is not None
            for design, d in m["designs"].items():
                mixed = d["mixed"]
                alone = d["decisions_alone"]["decision_seconds"]["p50"]
                out.append(
                    f"| {MODELS[t]} | `{design}` | {alone:.2f}"
                    f" s | {d['chat_alone']['chat_tokens_per_s_per_stream']['p50']:.1f} | "
                    f"{mixed['decisions_per_s']:.3f} | {mixed['chat_ttft_seconds']['p50']:.2f} s | "
                    f"{mixed['chat_tokens_per_s_total']:.1f} |"
                )
        out += ["", src.line(), ""]
    return out


def _startup(src: Sources) -> list[str]:
    out = [
        "## Start-up",
        "",
        "Process start to `/ping` 200, three starts each (`startup`), warm page cache; no "
        "interval (three values shown).",
        "",
        "| model | design | median | all starts | second llama-server ready |",
        "|---|---|---|---|---|",
    ]
    for t in MODELS:
        s = src.get(f"startup-{t}.json")
        if not s:
            continue
        for design, d in s["designs"].items():
            ping = d["seconds_to_ping_200"]
            split = [x for x in d["seconds_to_split_ready"] if x is not None]
            out.append(
                f"| {MODELS[t]} | {design} ({d['sharing']}) | {ping['median']:.1f} s | "
                + ", ".join(f"{x:.1f}" for x in ping["all"])
                + " s | "
                + (", ".join(f"{x:.1f}" for x in split) + " s" if split else "—")
                + " |"
            )
    out += ["", src.line(), ""]
    return out


def autoscaling(src: Sources) -> list[str]:
    """SageMaker's target (invocations per instance per minute) from the measured rate."""
    out = [
        "`SageMakerVariantInvocationsPerInstance` counts requests per instance **per minute**; "
        "the benchmarks measure decisions per second. With r the sustainable rate (the best of "
        "the `scaling` suite's 1-8 concurrent clients) and 0.7 a margin for bursts and the "
        "minutes a new instance takes:",
        "",
        "    --target-invocations K,   K = 60 x r x 0.7",
        "",
        "| model | r (decisions/s) | K | from |",
        "|---|---|---|---|",
    ]
    for t in MODELS:
        s = src.get(f"scaling-{t}.json")
        if not s:
            continue
        n, best = max(s["by_clients"].items(), key=lambda kv: kv[1]["decisions_per_s"])
        r = best["decisions_per_s"]
        out.append(
            f"| {MODELS[t]} | {r:.2f} ({n} clients) | {60 * r * 0.7:.0f} | "
            f"`bench/results/scaling-{t}.json` |"
        )
    out += [
        "",
        src.line(),
        "",
        "These rates come from a 2-core machine, on a state the server holds (short questions); "
        'cold states cost more (docs/benchmarks.md, "Latency, throughput and memory"). Measure '
        "r on the instance type you deploy (`python -m bench --endpoint http://<host>:8080 "
        "scaling`) and divide K by the mean number of decisions per request when requests carry "
        'several (`{"decisions": [...]}` is one invocation).',
    ]
    return out


def docs_markdown() -> str:
    src = Sources()
    body = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python -m bench.report --docs` (`make docs`) from bench/results/*.json;"
        " do not edit by hand. -->",
        "",
        "Every number here is read from `bench/results/*.json`. Each table names its files, the "
        "date each one records and the commit where one is recorded. Ratios carry a paired "
        f"bootstrap 95 % interval ({BOOTSTRAP:,} resamples of the pairs, fixed seed) where the "
        "file keeps each pair; where it keeps only medians the table says so. Accuracies carry "
        'a Wilson 95 % interval. A target such as "<= 1.05x" is called met only when the '
        "interval's upper bound is within it. Only same-run comparisons count: absolute times "
        "on this shared 2-core VM move by up to 1.5x between runs.",
        "",
        "Run them: `make bench` (SmolLM2, then Qwen2.5-Coder-0.5B), or one suite on any GGUF: "
        "`python -m bench --model M.gguf --tag T SUITE` (suites: `jevbench`, `generation`, "
        "`order`, `overhead`, `shared`, `prefix`, `scaling`, `floor`, `concurrency`, `split`, "
        "`prior`, `options`, `labels`, `mixed`, `mixed_rounds`, `startup`); `python -m bench "
        "--endpoint http://host:8080 SUITE` measures a running server. Then `make docs`.",
        "",
        "## Headline",
        "",
        *headline(src),
        "",
        src.line(),
        "",
        *_floor(src),
        *_concurrency(src),
        *_split(src),
        *_shared(src),
        *_accuracy(src),
        *_prior(src),
        *_scaling(src),
        *_options(src),
        *_cpu_sharing(src),
        *_startup(src),
        *report_gpu.section(sorted(RESULTS.glob("gpu-*.json")), src.get, src.line),
        "## Autoscaling target",
        "",
        *autoscaling(src),
        "",
    ]
    used = src.all_used
    rest = sorted(
        p.name for p in RESULTS.iterdir() if p.name not in used and not p.name.startswith(".")
    )
    if rest:
        body += ["## Files not shown here", ""]
        for name in rest:
            why = NOT_SHOWN.get(name, "not read by this report")
            if name.startswith("eval-"):
                why = "its reliability diagram is docs/img/eval-reliability.png (docs/eval.md)"
            elif name.startswith(("memory-", "repack-")):
                why = "docs/memory.md (`python -m bench.memory --table`)"
            elif name.startswith("readouts-"):
                why = "docs/readouts.md (`python -m bench.readouts --docs`)"
            elif name.endswith(".md"):
                why = "a hand-written note of an earlier run"
            elif name.endswith(".png"):
                why = "a plot of its suite's own run"
            body.append(f"- `{name}`: {why}.")
        body.append("")
    return "\n".join(line for line in body).rstrip() + "\n"


def readme_block() -> str:
    src = Sources()
    lines = headline(src)
    return "\n".join(
        [
            BENCH_BEGIN,
            *lines,
            "",
            "Ratios: paired bootstrap 95 % interval; accuracies: Wilson 95 % interval. "
            + src.brief(),
            BENCH_END,
        ]
    )


def sagemaker_block() -> str:
    return "\n".join([SCALE_BEGIN, *autoscaling(Sources()), SCALE_END])


def with_block(text: str, block: str, begin: str, end: str) -> str:
    start, stop = text.index(begin), text.index(end) + len(end)
    return text[:start] + block + text[stop:]


def _plots(img: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plt.rcParams.update({"font.size": 9, "svg.hashsalt": "semif", "figure.dpi": 100})
    colours = dict(zip(MODELS, ("#1f77b4", "#d62728", "#2ca02c")))
    save = {"dpi": 100, "metadata": {"Software": None}}

    # Latency against prompt length: the engine's forward pass and llama-server's floor.
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for tag, label in MODELS.items():
        f = _read(f"floor-{tag}.json")
        if not f:
            continue
        pts = sorted(f["lengths"].values(), key=lambda v: v["prompt_tokens"])
        x = [v["prompt_tokens"] for v in pts]
        ax.plot(
            x,
            [v["decision_forward_seconds"] for v in pts],
            "o-",
            color=colours[tag],
            label=f"{label}: decision",
        )
        ax.plot(
            x,
            [v["floor_seconds"] for v in pts],
            "s--",
            color=colours[tag],
            alpha=0.6,
            label=f"{label}: llama-server floor",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _pos: f"{v:,g}")
    ax.set_xticks([200, 500, 1000, 2000, 5000])
    ax.set_yticks([0.5, 1, 2, 5, 10, 20, 50, 100])
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("seconds (median)")
    ax.set_title("A decision against llama-server's prompt processing (2 CPU cores)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(img / "floor.png", **save)
    plt.close(fig)

    # Shared state: decisions/s of one shared request, singles on a held state, cold singles.
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    kinds = [
        ("shared", "one shared request"),
        ("singles_reusing_prefix", "singles, state held"),
        ("singles_cold", "cold singles"),
    ]
    tags = [t for t in MODELS if _read(f"shared-{t}.json")]
    width = 0.8 / len(kinds)
    for i, (key, label) in enumerate(kinds):
        vals = [_read(f"shared-{t}.json")["decisions_per_s"][key] for t in tags]  # type: ignore[index]
        ax.bar([j + i * width for j in range(len(tags))], vals, width, label=label)
    ax.set_xticks([j + width for j in range(len(tags))], [MODELS[t] for t in tags])
    ax.set_ylabel("decisions/s")
    ax.set_title("21 questions on one ~740-token state (2 CPU cores)")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(img / "shared.png", **save)
    plt.close(fig)

    # Accuracy per model with Wilson intervals.
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    series = []
    for t in MODELS:
        j, o = _read(f"jevbench-{t}.json"), _read(f"order-{t}.json")
        pts = []
        if j:
            pts.append(("JevBench", j["correct"], j["tasks"]))
        if o:
            runs = [(x, r) for x in o["rows"] for r in x["runs"]]
            pts.append(
                (
                    "order suite, one order",
                    sum(r["decision_argmax"] == x["expected"] for x, r in runs),
                    len(runs),
                )
            )
            pts.append(
                (
                    "order suite, permutations: n",
                    sum(x["permuted_argmax"] == x["expected"] for x in o["rows"]),
                    len(o["rows"]),
                )
            )
        series.append((t, pts))
    names = ["JevBench", "order suite, one order", "order suite, permutations: n"]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs, ys, lo, hi = [], [], [], []
        for j, (_t, pts) in enumerate(series):
            for n, k, total in pts:
                if n == name:
                    p = k / total
                    a, b = wilson(k, total)
                    xs.append(j + i * width)
                    ys.append(p)
                    lo.append(max(0.0, p - a))
                    hi.append(max(0.0, b - p))
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=name)
    ax.set_xticks([j + width for j in range(len(series))], [MODELS[t] for t, _ in series])
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy (Wilson 95 % interval)")
    ax.set_title("Accuracy per model")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(img / "accuracy.png", **save)
    plt.close(fig)

    # The eval reliability diagram: each bin's accuracy against its mean confidence, with the
    # rows it holds (a bin of two rows says little), from `semif-proxy eval`'s results.
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    ax.plot([0, 1], [0, 1], "--", color="grey", label="perfect calibration")
    for path in sorted(RESULTS.glob("eval-*.json")):
        data = json.loads(path.read_text())
        for target in data["targets"]:
            points = [b for b in target["metrics"]["reliability"] if b["rows"]]
            xs = [b["confidence"] for b in points]
            ys = [b["accuracy"] for b in points]
            m = target["metrics"]
            label = f"{path.stem}: {m['correct']}/{m['answered']}, ECE {m['ece']:.3f}"
            ax.plot(xs, ys, "o-", label=label)
            for b, x, y in zip(points, xs, ys):
                ax.annotate(str(b["rows"]), (x, y), textcoords="offset points", xytext=(4, 4))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence (probability of the answer), 10 bins")
    ax.set_ylabel("accuracy")
    ax.set_title("Reliability of semif-proxy eval (rows per bin beside each point)")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(img / "eval-reliability.png", **save)
    plt.close(fig)


def write_docs(root: Path, plots: bool = True) -> list[Path]:
    """docs/benchmarks.md, its plots, and the generated blocks of README.md and
    docs/sagemaker.md, under root (the repository, or a folder the tests compare)."""
    repo = Path(__file__).resolve().parents[1]
    written = []
    page = root / PAGE
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(docs_markdown())
    written.append(page)
    for rel, block, begin, end in (
        (README_FILE, readme_block(), BENCH_BEGIN, BENCH_END),
        (SAGEMAKER_PAGE, sagemaker_block(), SCALE_BEGIN, SCALE_END),
    ):
        target = root / rel
        source = target if target.exists() else repo / rel
        if source.exists() and begin in source.read_text():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(with_block(source.read_text(), block, begin, end))
            written.append(target)
    if plots:
        img = root / IMG
        img.mkdir(parents=True, exist_ok=True)
        _plots(img)
        written += [
            img / n for n in ("floor.png", "shared.png", "accuracy.png", "eval-reliability.png")
        ]
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    parser.add_argument("tags", nargs="*", help="models (default: all three)")
    parser.add_argument("--docs", action="store_true", help="write the generated docs")
    parser.add_argument("--out", type=Path, help="root to write the docs under (default: repo)")
    parser.add_argument("--no-plots", action="store_true", help="with --docs: markdown only")
    args = parser.parse_args(argv)
    if args.docs:
        root = args.out or Path(__file__).resolve().parents[1]
        try:
            written = write_docs(root, plots=not args.no_plots)
        except ImportError:
            print("the plots need matplotlib: pip install 'semif-proxy[bench]'", file=sys.stderr)
            return 2
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        return 0
    tags = args.tags or list(MODELS)
    print("\n".join(side_by_side(tags)))
    for tag in tags:
        print(f"\n**{tag}**\n")
        print("| benchmark | result | detail |\n|---|---|---|")
        for name, result, detail in rows(tag):
            print(f"| {name} | {result} | {detail} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
