"""`python -m bench.report`: the README's benchmark tables from bench/results/*.json."""

from __future__ import annotations

import json
import sys
from typing import Any

from bench.common import RESULTS


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


def main() -> int:
    tags = sys.argv[1:] or ["smollm2", "qwen2.5-0.5b", "qwen2.5-1.5b"]
    print("\n".join(side_by_side(tags)))
    for tag in tags:
        print(f"\n**{tag}**\n")
        print("| benchmark | result | detail |\n|---|---|---|")
        for name, result, detail in rows(tag):
            print(f"| {name} | {result} | {detail} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
