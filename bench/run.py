"""`make bench` / `python -m bench`: run the benchmarks against one server and write
bench/results/<suite>-<model>.json plus a markdown summary.

    python -m bench --model ~/.cache/semif-proxy/models/SmolLM2-135M-Instruct.Q4_1.gguf all
    python -m bench --endpoint http://127.0.0.1:8080 jevbench --limit 50
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench import common, concurrency, floor, memory, mixed, options, prior, split, startup, suites

SUITES = ("jevbench", "generation", "order", "overhead", "shared", "prefix", "scaling", "floor")
# Suites that start their own servers (several configurations, or the start itself).
# (`split` and `repack` run the engine in-process, no server; `concurrency` starts the proxy
# and a stock llama-server.)
OWN_SERVERS = (
    "mixed",
    "mixed_rounds",
    "startup",
    "prior",
    "options",
    "labels",
    "split",
    "memory",
    "repack",
    "concurrency",
)
# `all` (make bench): prior, options and labels are left out, each its own long run (README).
IN_ALL = (*SUITES, "mixed", "startup", "split")


class Endpoint:
    """An already running server (--endpoint) looks like a started one to the suites."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        health = common.get_json(self.url + "/health")

        class _Proc:
            pid = health["pid"]

        self.proc = _Proc()


def run_suite(name: str, server: Any, args: argparse.Namespace) -> dict[str, Any]:
    if name == "jevbench":
        out = suites.jevbench(server, args.limit, args.tasks, via_invocations=False)
        if args.invocations:
            out["via_invocations"] = suites.jevbench(server, args.limit, args.tasks, True)
        return out
    if name == "generation":
        return suites.generation(
            server, args.limit or 40, args.tasks or "easy,original", n_probs=10
        )
    if name == "order":
        return suites.option_order(server, args.limit, args.order_tasks)
    if name == "overhead":
        return suites.overhead(server, repeats=args.repeats)
    if name == "shared":
        return suites.shared(server, questions=21, rounds=max(2, args.repeats // 10))
    if name == "floor":
        # With a model file, the floor is a stock llama-server in each weight layout (the
        # faster per row); against --endpoint, that server's own llama-server.
        if args.floor_lengths:
            lengths = tuple(int(n) for n in args.floor_lengths.split(","))
            return floor.run(server.url, lengths, repeats=args.repeats, model=args.model)
        return floor.run(server.url, repeats=max(2, args.repeats // 10), model=args.model)
    if name == "prefix":
        return suites.prefix_cache(server, state_tokens=1200, rounds=max(2, args.repeats // 10))
    return suites.scaling(
        server,
        [100, 500, 1000, 2000, 4000],
        [2, 4, 8, 16, 26],
        [1, 2, 4, 8],
        per_client=max(2, args.repeats // 10),
    )


def headline(name: str, r: dict[str, Any]) -> str:
    if name in ("options", "labels"):
        return options.headline(r)
    if name == "split":
        return split.headline(r)
    if name == "memory":
        return memory.headline(r)
    if name == "repack":
        return memory.prefill_headline(r)
    if name == "prior":
        return prior.headline(r)
    if name == "startup":
        parts = []
        for design, d in r["designs"].items():
            took, mem = d["seconds_to_ping_200"], d["memory_kb"]
            pss = sum(m["pss"] for m in mem.values()) / 1024
            part = (
                f"{design} ({d['sharing']}): /ping 200 after {took['median']:.1f} s median of "
                f"{len(took['all'])}, PSS {pss:.0f} MiB in all"
            )
            if "llama_server_split" in mem:
                own = mem["llama_server_split"]["private"] / 1024
                part += f", the second llama-server {own:.0f} MiB of its own"
            parts.append(part)
        return "; ".join(parts)
    if name == "concurrency":
        return concurrency.headline(r)
    if name == "floor":

        def layouts(row: dict[str, Any]) -> str:
            by = row.get("floor_seconds_by_layout", {})
            return ", ".join(f"{k} {v:.2f} s" for k, v in by.items())

        return (
            "; ".join(
                f"{row['prompt_tokens']:.0f} tokens: floor {row.get('floor_layout', 'own')} "
                f"({layouts(row)}), forward/floor "
                f"{row['forward_over_floor']:.2f}x (paired "
                f"{row.get('forward_over_floor_paired_p50', float('nan')):.2f}x), HTTP/floor "
                f"{row['http_over_floor']:.2f}x"
                for row in r["lengths"].values()
            )
            + f" (target <= {r['target_ratio']}x)"
        )
    if name == "mixed_rounds":
        a, b = r["designs"]
        labels = {
            "decisions_per_s": "decisions/s",
            "decision_p50": "decision p50",
            "chat_tokens_per_s_total": "chat tokens/s in all",
            "chat_tokens_per_s_per_stream_p50": "chat tokens/s per stream",
            "chat_ttft_p50": "TTFT p50",
            "chat_ttft_p95": "TTFT p95",
        }
        parts = [
            f"{labels[key]} {a}/{b} median {r['ratio_summary'][key]['p50']:.2f}x "
            f"(rounds: {', '.join(f'{v:.2f}' for v in values)})"
            for key, values in r["ratios"].items()
        ]
        pooled = r.get("chat_ttft_pooled") or {}
        if pooled:
            parts.append(
                "TTFT of all rounds p50/p95/max "
                + ", ".join(
                    f"{d} {pooled[s]['p50']:.2f}/{pooled[s]['p95']:.2f}/{pooled[s]['max']:.2f} s"
                    for d, s in ((a, "a"), (b, "b"))
                )
            )
        gap = r.get("chat_gap_seconds") or 0
        what = f"{r['rounds']} rounds of the {r['phase']} phase"
        return what + (f", chat gap {gap:g} s" if gap else "") + ": " + "; ".join(parts)
    if name == "mixed":
        parts = []
        for design, d in r["designs"].items():
            mix = d["mixed"]
            parts.append(
                f"{design}: decisions alone {d['decision_p50_over_optimum']:.2f}x optimum, chat "
                f"alone {d['chat_rate_over_optimum']:.2f}x; mixed decision p50 "
                f"{mix['decision_seconds']['p50']:.2f} s ({mix['decisions_per_s']:.3f}/s), chat "
                f"{mix['chat_tokens_per_s_per_stream']['p50']:.1f} tok/s per stream "
                f"({mix['chat_tokens_per_s_total']:.1f} in all), TTFT p50 "
                f"{mix['chat_ttft_seconds']['p50']:.2f} s"
            )
        return "; ".join(parts)
    if name == "jevbench":
        lat = r["latency_seconds"]
        return (
            f"accuracy {r['correct']}/{r['tasks']} ({r['accuracy']:.1%}), "
            f"p50 {lat['p50'] * 1000:.0f} ms, "
            f"p95 {lat['p95'] * 1000:.0f} ms, max {lat['max'] * 1000:.0f} ms, ECE {r['ece']:.3f}"
        )
    if name == "generation":
        return (
            f"chat/decision p50 {r['chat_over_decision_p50']:.2f}x, /completion/decision p50 "
            f"{r['completion_over_decision_p50']:.2f}x, chat argmax agreement "
            f"{r['chat_argmax_agreement']:.0%} (unparseable {r['chat_unparseable']:.0%}), "
            f"/completion missing a letter in top-{r['n_probs']}: "
            f"{r['completion_missing_some_letter']:.0%}"
        )
    if name == "order":
        d, c = r["by_path"]["decision"], r["by_path"]["chat"]
        return (
            f"{r['items']} items in every rotation ({r['runs']} runs): decision accuracy "
            f"{d['accuracy']:.0%}, first-listed {d['first_listed_share']:.0%}; chat accuracy "
            f"{c['accuracy']:.0%}, first-listed {c['first_listed_share']:.0%} (position-blind "
            f"{r['first_listed_share_if_position_blind']:.0%}); with permutations=n accuracy "
            f"{r['permuted_accuracy']:.0%} at {r['permuted_over_single_p50']:.2f}x the latency"
        )
    if name == "overhead":
        return f"HTTP/forward p50 {r['ratio_p50']:.3f} (target <= {r['target_ratio_p50']})"
    if name == "shared":
        rate = r["decisions_per_s"]
        return (
            f"{r['questions']} questions, {r['prompt_tokens_per_question']} tokens each: shared "
            f"{rate['shared']:.1f}/s vs cold singles {rate['singles_cold']:.1f}/s "
            f"({r['speedup_vs_cold_singles']:.2f}x, target >= {r['target_speedup']}x) vs singles "
            f"reusing the prefix {rate['singles_reusing_prefix']:.1f}/s "
            f"({r['speedup_vs_reusing_singles']:.2f}x)"
        )
    if name == "prefix":
        return (
            f"{r['state_tokens']}-token state: warm/cold p50 {r['warm_over_cold_p50']:.2f} "
            f"(target <= {r['target_ratio']}), {r['cache_hits']} cache hits"
        )
    mem = r["memory_kb"]
    pss = sum(m.get("pss", 0) for m in mem.values()) / 1024
    rates = ", ".join(f"{c}: {v['decisions_per_s']:.1f}/s" for c, v in r["by_clients"].items())
    return f"clients {rates}; PSS total {pss:.0f} MiB"


def write_summary(tag: str, lines: list[str]) -> None:
    """summary-<tag>.md: this run's header and headlines, and the headlines of suites run
    before and not now (one run rarely repeats every suite)."""
    path = common.RESULTS / f"summary-{tag}.md"
    fresh = {line.split("**")[1] for line in lines if line.startswith("- **")}
    kept = []
    if path.exists():
        kept = [
            line
            for line in path.read_text().splitlines()
            if line.startswith("- **") and line.split("**")[1] not in fresh
        ]
    path.write_text("\n".join([*lines, *kept]) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("suites", nargs="+", choices=(*SUITES, *OWN_SERVERS, "all"))
    parser.add_argument("--mixed-seconds", type=float, default=30.0, help="per mixed phase")
    parser.add_argument(
        "--mixed-designs",
        default=",".join(mixed.DEFAULT_DESIGNS),
        help=f"of {','.join(mixed.DESIGNS)}; mixed_rounds: exactly two, also of "
        f"{','.join(mixed.OPTIMA)}",
    )
    parser.add_argument(
        "--mixed-rounds",
        type=int,
        default=4,
        help="mixed_rounds: rounds of the two --mixed-designs (even: each goes first as often)",
    )
    parser.add_argument(
        "--mixed-phase", default="mixed", choices=tuple(mixed.PHASES), help="mixed_rounds' phase"
    )
    parser.add_argument(
        "--mixed-chat-gap",
        type=float,
        default=0.0,
        help="mixed_rounds: chat clients wait this long on average before each call (0: none)",
    )
    parser.add_argument(
        "--floor-lengths",
        help="floor: these prompt lengths only (e.g. 200), --repeats pairs each, written to "
        "floor-<lengths>-<tag>.json",
    )
    parser.add_argument("--clients", type=int, default=4, help="concurrency: concurrent clients")
    parser.add_argument(
        "--prompts", type=int, default=16, help="concurrency: distinct decisions per round"
    )
    parser.add_argument(
        "--rounds", type=int, default=4, help="concurrency: rounds, the sides alternating"
    )
    parser.add_argument(
        "--concurrency-tokens", type=int, default=290, help="concurrency: prompt tokens, about"
    )
    parser.add_argument(
        "--concurrency-chat-tokens",
        type=int,
        default=32,
        help="concurrency: each client's chat answer per round and side (0: no chat)",
    )
    parser.add_argument(
        "--stock-layouts",
        default="same",
        choices=("same", "both"),
        help="concurrency: the stock llama-server in the default server's weight layout here, "
        "or in both (the proxy compared with the faster)",
    )
    parser.add_argument(
        "--memory-ctx",
        type=int,
        default=0,
        help="memory: the context of the engine and llama-server (0: the test servers' 4096; "
        "-1: the product's own, from the model)",
    )
    parser.add_argument("--model", type=Path, help="GGUF to serve (started here)")
    parser.add_argument("--endpoint", help="use a running server instead")
    parser.add_argument("--limit", type=int, help="at most this many JevBench tasks")
    parser.add_argument("--tasks", help="JevBench files or task ids, comma-separated")
    parser.add_argument(
        "--order-tasks", default="easy", help="JevBench files or ids for the order suite"
    )
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--invocations", action="store_true", help="JevBench also via /invocations")
    parser.add_argument("--tag", help="name in the results files (default: the model file stem)")
    args = parser.parse_args(argv)
    names = IN_ALL if "all" in args.suites else tuple(args.suites)
    if "mixed_rounds" in names:
        wrong = mixed.check_rounds(
            [d.strip() for d in args.mixed_designs.split(",")], args.mixed_phase
        )
        if wrong:
            parser.error(wrong)
    if not args.endpoint and not args.model:
        parser.error("give --model or --endpoint")
    tag = args.tag or (args.model.stem if args.model else "endpoint")
    lines = [f"# {tag}", "", f"machine: {json.dumps(common.machine())}", ""]
    for name in [n for n in names if n in OWN_SERVERS]:
        if not args.model:
            parser.error(f"{name} starts its own servers: give --model")
        start = time.perf_counter()
        file_name = name
        if name == "startup":
            result = startup.run(args.model)
        elif name in ("options", "labels"):
            result = options.run(args.model, sizes=name == "options")
        elif name == "prior":
            result = prior.run(args.model, args.limit, args.tasks)
        elif name == "split":
            result = split.run(args.model)
        elif name == "memory":
            result = memory.run(args.model, None if args.memory_ctx < 0 else args.memory_ctx)
            if args.memory_ctx:  # beside the default run, not over it
                file_name = f"memory-ctx{'model' if args.memory_ctx < 0 else args.memory_ctx}"
        elif name == "repack":
            result = memory.prefill(args.model)
        elif name == "concurrency":
            result = concurrency.run(
                args.model,
                n_clients=args.clients,
                n_prompts=args.prompts,
                rounds=args.rounds,
                tokens=args.concurrency_tokens,
                chat_tokens=args.concurrency_chat_tokens,
                stock_layouts=args.stock_layouts,
            )
        elif name == "mixed_rounds":
            a, b = (d.strip() for d in args.mixed_designs.split(","))
            gap = args.mixed_chat_gap
            result = mixed.rounds(
                args.model, args.mixed_seconds, (a, b), args.mixed_rounds, args.mixed_phase, gap
            )
            file_name = f"mixed_rounds-{args.mixed_phase}-{a}-{b}"  # one file per comparison
            if gap:
                file_name += f"-gap{gap:g}"
        else:
            designs = tuple(args.mixed_designs.split(","))
            result = mixed.run(args.model, args.mixed_seconds, designs)
        result.update(wall_seconds=time.perf_counter() - start, machine=common.machine(), model=tag)
        common.write(f"{file_name}-{tag}", result)
        lines.append(f"- **{file_name}**: {headline(name, result)}")
        print(lines[-1], flush=True)
    names = tuple(n for n in names if n not in OWN_SERVERS)
    if not names:
        write_summary(tag, lines)
        return 0
    server: Any = Endpoint(args.endpoint) if args.endpoint else common.start_server(args.model)
    try:
        for name in names:
            start = time.perf_counter()
            result = run_suite(name, server, args)
            result["wall_seconds"] = time.perf_counter() - start
            result["machine"] = common.machine()
            # What the server ran with (threads per process, CPU sharing, and whether dynamic's
            # second llama-server ran), next to the numbers.
            health = common.get_json(server.url + "/health")
            result["server_cpu"] = health.get("cpu")
            result["server_split"] = health.get("llama_server_split")
            result["model"] = tag
            file_name = name
            if name == "floor" and args.floor_lengths:  # beside the full run, not over it
                file_name = f"floor-{args.floor_lengths.replace(',', '-')}"
            path = common.write(f"{file_name}-{tag}", result)
            if name == "jevbench":
                suites.plots(result, path.with_suffix(".png"))
            line = f"- **{file_name}**: {headline(name, result)}"
            print(line, flush=True)
            lines.append(line)
    finally:
        if not args.endpoint:
            server.stop()
    write_summary(tag, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
