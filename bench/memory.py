"""`memory`: what the server's processes hold, with llama.cpp's weight repacking on and off
(SEMIF_REPACK), under CPU sharing `dynamic` (the default: the engine, llama-server and a second
llama-server) and the gate (no second llama-server); and `repack`: prefill speed of both weight
layouts in the engine.

Repacking copies the weights that ggml's CPU backend has interleaved kernels for into anonymous
memory of each process; unrepacked, every process reads the one mmap'ed GGUF (page cache,
shared). Each process's PSS (the shared pages split between the processes that map them) and
private bytes (Private_Clean + Private_Dirty) come from /proc/PID/smaps_rollup, for the proxy
(engine in-process) and every llama-server child, after the load, a decision, a chat and a
shared-state request (with a chat beside it, which under `dynamic` goes to the second
llama-server). Their PSS in all is compared with the weights (the file) plus the KV cache each
process is configured for (n_layer x n_ctx x n_head_kv x (head_dim_k + head_dim_v) x 2 bytes, F16).

    python -m bench --model M.gguf --tag T memory     # bench/results/memory-T.json
    python -m bench --model M.gguf --tag T repack     # bench/results/repack-T.json
    python -m bench.memory --table                    # docs/memory.md from memory-*.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS, get_json, post, settled
from bench.suites import LONG_STATE_UNIT
from semif_proxy.model.gpu_estimate import ModelShape, Process, need
from semif_proxy.testing.server import ProxyProcess

SHARINGS = ("dynamic", "gate")
REPACKS = ("on", "off")
# What the benchmark servers set on top of ProxyProcess's loopback ports: the product's own
# threads and llama-server slots (CPU sharing as deployed). ProxyProcess's 4,096-token context
# stays (engine and llama-server alike) unless --memory-ctx says otherwise.
DEFAULTS: dict[str, str | None] = {"SEMIF_THREADS": None, "SM_LLAMA_CPP_PARALLEL": None}
TARGET = 1.3  # the processes in all, at most this x (weights + configured KV)
KV_BYTES = 2  # F16 cells, llama.cpp's default cache type (and the engine's)
PAGE = Path(__file__).resolve().parents[1] / "docs" / "memory.md"
MIB = 1 << 20

# The options of the decision and the shared-state request.
OPTIONS = [
    {"id": "hub", "description": "at the regional hub"},
    {"id": "home", "description": "delivered"},
    {"id": "lost", "description": "lost"},
]


def cpu() -> dict[str, Any]:
    """The CPU's SIMD flags that decide the kernels (and SEMIF_REPACK=auto's choice here), and
    how busy the machine was: a 1-minute load average above 1 on this 2-core machine means
    other work shared the cores while this ran."""
    from semif_proxy.settings import repack_choice

    flags: set[str] = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.split(":")[0].strip() == "flags":
            flags.update(line.split(":", 1)[1].split())
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "amx_tile")
    return {
        "simd_flags": [f for f in wanted if f in flags],
        "repack_auto": repack_choice("auto")._asdict(),
        "load_average": list(os.getloadavg()),
    }


# -- /proc ------------------------------------------------------------------------------------


def rollup(pid: int) -> dict[str, int]:
    """smaps_rollup in bytes: rss, pss, private (Private_Clean + Private_Dirty), anonymous,
    and pss_anon / pss_file where the kernel has them."""
    out: dict[str, int] = {"private": 0}
    keys = {"Rss": "rss", "Pss": "pss", "Anonymous": "anonymous"}
    keys.update({"Pss_Anon": "pss_anon", "Pss_File": "pss_file"})
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Private_Clean", "Private_Dirty"):
            out["private"] += int(rest.split()[0]) * 1024
        elif key in keys:
            out[keys[key]] = int(rest.split()[0]) * 1024
    return out


def children(pid: int) -> list[int]:
    """Every descendant of pid (/proc/PID/task/*/children), depth first."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            text = (task / "children").read_text()
        except OSError:
            continue
        for child in text.split():
            found.append(int(child))
            found += children(int(child))
    return found


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]


def _flag(argv: list[str], *names: str) -> str | None:
    for i, word in enumerate(argv[:-1]):
        if word in names:
            return argv[i + 1]
    return None


# -- KV cache as configured -------------------------------------------------------------------


def kv_bytes(shape: ModelShape, n_ctx: int) -> int:
    """One process's KV cache: n_ctx cells of every layer, K and V, F16 (gpu_estimate's
    formula: every layer's cache, as where all layers are on the GPU)."""
    return need(shape, Process("kv", n_gpu_layers=-1, n_ctx=n_ctx, kv_bytes=KV_BYTES)).kv


# -- one configuration ------------------------------------------------------------------------


def _snapshot(proxy_pid: int, health: dict[str, Any]) -> dict[str, Any]:
    roles = {proxy_pid: "proxy"}
    for key in ("llama_server", "llama_server_split"):
        pid = (health.get(key) or {}).get("pid")
        if pid:
            roles[int(pid)] = key
    procs: dict[str, Any] = {}
    for pid in [proxy_pid, *children(proxy_pid)]:
        try:
            argv = cmdline(pid)
            mem = rollup(pid)
        except OSError:
            continue  # gone in between
        name = roles.get(pid) or f"child-{Path(argv[0]).name if argv else pid}"
        procs[name] = {"pid": pid, **mem}
        if name.startswith("llama_server"):
            procs[name]["argv_no_repack"] = "--no-repack" in argv
            # Its context as started (-c; unset or 0: the model's training context). Its slots
            # share these cells: the whole context is one cache.
            procs[name]["ctx"] = _flag(argv, "-c", "--ctx-size")
    total = {k: sum(p.get(k, 0) for p in procs.values()) for k in ("pss", "private", "rss")}
    return {"processes": procs, "total": total}


def _decision(i: int) -> dict[str, Any]:
    return {
        "id": f"m{i}",
        "state": f"Ticket {i}: " + LONG_STATE_UNIT * 4,
        "question": "Where is the parcel?",
        "options": OPTIONS,
    }


def _chat(url: str, words: int = 60) -> dict[str, Any]:
    body = {
        "messages": [{"role": "user", "content": "Summarise: " + LONG_STATE_UNIT * (words // 30)}],
        "temperature": 0,
        "max_tokens": 16,
    }
    reply = post(url + "/v1/chat/completions", body)
    assert reply.status == 200, reply.body
    timings = reply.body.get("timings") or {}
    return {"seconds": reply.seconds, "prompt_per_second": timings.get("prompt_per_second")}


def once(model: Path, sharing: str, repack: str, ctx: int | None) -> dict[str, Any]:
    shape = ModelShape.from_file(model)
    env = {**DEFAULTS, "SEMIF_CPU_SHARING": sharing, "SEMIF_REPACK": repack}
    if ctx is None:  # the product's own context: the engine's from the model, llama-server's own
        env.update({"SM_LLAMA_CPP_CTX_SIZE": None, "SEMIF_CTX_SIZE": None})
    elif ctx:
        env["SM_LLAMA_CPP_CTX_SIZE"] = str(ctx)
    with tempfile.TemporaryDirectory() as tmp:
        server = ProxyProcess(model, env, log_path=Path(tmp) / "memory.log")
        try:
            server.start(timeout=900)
            settled(server.url, timeout=900)
            health = get_json(server.url + "/health")
            assert server.proc is not None
            pid = server.proc.pid
            steps: dict[str, Any] = {"load": _snapshot(pid, health)}
            reply = post(server.url + "/v1/decisions", {"decision": _decision(0)})
            assert reply.status == 200, reply.body
            steps["decision"] = _snapshot(pid, health)
            chat = _chat(server.url)
            steps["chat"] = _snapshot(pid, health)
            # The shared-state request, and a chat while it runs (dynamic: the second server).
            beside: dict[str, Any] = {}
            thread = threading.Thread(target=lambda: beside.update(_chat(server.url)))
            shared = [dict(_decision(1), id=f"s{i}", question=f"Q{i}: where?") for i in range(6)]
            thread.start()
            reply = post(server.url + "/v1/decisions", {"decisions": shared})
            thread.join()
            assert reply.status == 200, reply.body
            steps["shared"] = _snapshot(pid, get_json(server.url + "/health"))
            final = get_json(server.url + "/health")
            # llama-server's own word on its context (its /props, for the record).
            reported = {}
            for key, port in (
                ("llama_server", server.upstream_port),
                ("llama_server_split", server.upstream_port + 1),
            ):
                if key in steps["shared"]["processes"]:
                    try:
                        props = get_json(f"http://127.0.0.1:{port}/props")
                    except OSError:
                        continue
                    reported[key] = (props.get("default_generation_settings") or {}).get("n_ctx")
            log = [json.loads(x) for x in server.log_lines()]
        finally:
            server.stop()
    ready = next((x for x in log if x.get("event") == "engine_ready"), {})
    skipped = next((x for x in log if x.get("event") == "llama_server_split_skipped"), None)
    engine_ctx = int(final["model"]["context_size"])
    contexts = {"proxy": engine_ctx}
    for key in ("llama_server", "llama_server_split"):
        proc = steps["shared"]["processes"].get(key)
        if proc:
            contexts[key] = int(proc["ctx"] or 0) or shape.n_ctx_train  # 0/unset: the model's
    kv = {key: kv_bytes(shape, n) for key, n in contexts.items()}
    weights = shape.file_bytes
    budget = weights + sum(kv.values())
    peak = max(s["total"]["pss"] for s in steps.values())
    return {
        "sharing": final["cpu"]["sharing"],
        "repack_setting": repack,
        "repack": final["model"].get("repack"),
        "engine_ready_repack": ready.get("repack"),
        "second_server": (final.get("llama_server_split") or {}).get("state"),
        "second_server_skipped": skipped,
        "contexts": contexts,
        "llama_server_props_n_ctx": reported,
        "weights_bytes": weights,
        "kv_bytes": kv,
        "budget_bytes": budget,
        "peak_pss_bytes": peak,
        "ratio": peak / budget,
        "within_target": peak <= TARGET * budget,
        "steps": steps,
        "chat": chat,
        "chat_beside_shared": beside,
    }


def run(model: Path, ctx: int | None = 0) -> dict[str, Any]:
    """Every {dynamic, gate} x {repack on, off}, repack alternating. ctx: 0 keeps
    ProxyProcess's context (4,096), None the product's own, a number sets it."""
    with model.open("rb") as fh:  # a warm page cache: every start reads the file from memory
        while fh.read(1 << 24):
            pass
    shape = ModelShape.from_file(model)
    out: dict[str, Any] = {
        "model_bytes": model.stat().st_size,
        "shape": {
            "n_layer": shape.n_layer,
            "n_head_kv": shape.n_head_kv,
            "head_dim_k": shape.head_dim_k,
            "head_dim_v": shape.head_dim_v,
            "n_ctx_train": shape.n_ctx_train,
        },
        "context_setting": "ProxyProcess's 4096" if ctx == 0 else (ctx or "the product's own"),
        "target_ratio": TARGET,
        "cpu_at_start": cpu(),
        "configs": {},
    }
    for sharing in SHARINGS:
        for repack in REPACKS:
            name = f"{sharing}-repack_{repack}"
            out["configs"][name] = once(model, sharing, repack, ctx)
            print(f"  {name}: {headline_one(out['configs'][name])}", flush=True)
    return out


def peak_step(c: dict[str, Any]) -> dict[str, Any]:
    """The snapshot (after the load, a decision, a chat, the shared request) with the most PSS."""
    return max(c["steps"].values(), key=lambda s: s["total"]["pss"])


def headline_one(c: dict[str, Any]) -> str:
    procs = peak_step(c)["processes"]
    parts = ", ".join(f"{k} {p['pss'] / MIB:.0f}" for k, p in procs.items())
    return (
        f"PSS {parts} = {c['peak_pss_bytes'] / MIB:.0f} MiB (peak) vs weights+KV "
        f"{c['budget_bytes'] / MIB:.0f} MiB: {c['ratio']:.2f}x"
    )


def headline(r: dict[str, Any]) -> str:
    return "; ".join(f"{name}: {headline_one(c)}" for name, c in r["configs"].items())


# -- prefill of both layouts ------------------------------------------------------------------

TEXT = (
    "Order 4471 was placed on the web shop, paid by card, packed in the Leipzig warehouse and "
    "handed to the carrier on Monday; tracking shows it in the regional hub since Wednesday. "
    "The customer wrote twice asking when it will arrive and whether the address can change. "
)


def prefill(model: Path, tokens: int = 441, runs: int = 3, threads: int = 0) -> dict[str, Any]:
    """One prompt of `tokens` tokens evaluated whole in the engine (score() of the prompt, on
    a fresh state), repack on and off alternating, `runs` each after one untimed; tokens/s.
    Threads: every core (the engine's default alone); ubatch 256 (the engine's on the CPU)."""
    from semif_proxy.engine import native

    threads = threads or os.cpu_count() or 1
    before = cpu()
    engines = {
        flag: native.Engine(
            str(model), n_ctx=2048, n_threads=threads, n_seq=3, n_ubatch=256, repack=flag == "on"
        )
        for flag in REPACKS
    }
    first = engines["on"]
    prompt = list(first.tokenize(TEXT * (tokens // 50 + 2), add_special=True))[:tokens]
    assert len(prompt) == tokens
    ids = list(first.tokenize("ABCD", add_special=False))
    rates: dict[str, list[float]] = {flag: [] for flag in REPACKS}
    for engine in engines.values():  # untimed: the first call's one-off costs (page faults)
        engine.score(prompt, [[]], ids, "restore")
    logits: dict[str, Any] = {}
    for r in range(runs):
        order = REPACKS if r % 2 == 0 else REPACKS[::-1]
        for flag in order:
            engine = engines[flag]
            engine.reset()
            start = time.perf_counter()
            row, _, _ = engine.score(prompt, [[]], ids, "restore")
            rates[flag].append(tokens / (time.perf_counter() - start))
            logits[flag] = [float(x) for x in row[0]]
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    return {
        "prompt_tokens": tokens,
        "threads": threads,
        "ubatch": 256,
        "tokens_per_s": rates,
        "median_tokens_per_s": {"on": on, "off": off},
        "off_over_on": off / on,
        "letter_logits": logits,
        "max_abs_logit_difference": max(
            abs(a - b) for a, b in zip(logits["on"], logits["off"], strict=True)
        ),
        "cpu_at_start": before,
        "load_average_at_end": list(os.getloadavg()),
    }


def prefill_headline(r: dict[str, Any]) -> str:
    t = r["tokens_per_s"]
    return (
        f"{r['prompt_tokens']}-token prefill, tok/s repack on "
        f"{'/'.join(f'{x:.1f}' for x in t['on'])} vs off {'/'.join(f'{x:.1f}' for x in t['off'])}"
        f": off/on {r['off_over_on']:.2f}x (letter logits differ by up to "
        f"{r['max_abs_logit_difference']:.3g})"
    )


# -- docs/memory.md ---------------------------------------------------------------------------


def _machine(r: dict[str, Any]) -> str:
    m, c = r.get("machine", {}), r.get("cpu_at_start", {})
    load = (c.get("load_average") or [0.0])[0]
    flags = "/".join(c.get("simd_flags", [])) or "?"
    return (
        f"{m.get('cpu', '?')} ({flags}), {m.get('cores', '?')} cores, {m.get('date', '?')}, "
        f"1-minute load average {load:.1f} at start"
    )


def _default(c: dict[str, Any]) -> bool:
    """The configuration a default server runs here: dynamic, with auto's choice."""
    auto = "on" if c.get("repack_auto_on") else "off"
    return c["sharing"] == "dynamic" and c["repack_setting"] == auto


def table(results: Path = RESULTS) -> str:
    """docs/memory.md from bench/results/memory-*.json (and repack-*.json)."""
    lines = [
        "# Memory",
        "",
        "<!-- Generated by `python -m bench.memory --table` from bench/results/memory-*.json "
        "and repack-*.json; do not edit. -->",
        "",
        "What the server's processes hold once started and after a decision, a chat and a "
        "shared-state request (the largest of these), with llama.cpp's weight repacking on and "
        "off (`SEMIF_REPACK`), under CPU sharing `dynamic` (the default: the proxy with its "
        "engine, llama-server and a second llama-server) and the gate (no second "
        "llama-server). PSS (proportional set size) splits the mmap'ed model's pages between "
        "the processes that map them, so the figures add up to what the machine holds; "
        '"weights + KV" is the GGUF file plus the F16 KV cache each process is configured '
        "for (context: the engine's / each llama-server's); \"second's own\" is what the "
        "second llama-server holds privately (what starting it costs). MiB. Repacked, each "
        "process keeps its own copy of the weights in the CPU backend's layouts; unrepacked, "
        "they all read the one mmap'ed file. `SEMIF_REPACK=auto` now measures both layouts at "
        "start-up and keeps the unrepacked one unless the repacked one is at least 1.10x "
        "faster (docs/operations.md); on the CPU these rows were measured on (no AMX) its rule "
        "then was off, and unrepacked prefilled Qwen2.5-1.5B 1.25x faster there.",
        "",
        "| model | context | sharing | repack | proxy | llama-server | second llama-server | all "
        "| weights + KV | ratio | second's own |",
        "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    runs = [(p, json.loads(p.read_text())) for p in results.glob("memory-*.json")]
    runs.sort(key=lambda pr: (pr[1].get("model", ""), pr[0].name))
    verdicts, sources = [], []
    for path, r in runs:
        sources.append(f"- `{path.name}`: {_machine(r)}")
        tag = r.get("model", path.stem[len("memory-") :])
        auto_on = r.get("cpu_at_start", {}).get("repack_auto", {}).get("on", False)
        for c in r["configs"].values():
            p = peak_step(c)["processes"]

            def mib(key: str, field: str = "pss", p: dict[str, Any] = p) -> str:
                return f"{p[key][field] / MIB:,.0f}" if key in p else "-"

            ctx = c["contexts"]
            lines.append(
                f"| {tag} | {ctx['proxy']} / {ctx.get('llama_server', '-')} | {c['sharing']} | "
                f"{c['repack_setting']} | {mib('proxy')} | "
                f"{mib('llama_server')} | {mib('llama_server_split')} | "
                f"{c['peak_pss_bytes'] / MIB:,.0f} | {c['budget_bytes'] / MIB:,.0f} | "
                f"{c['ratio']:.2f}x | {mib('llama_server_split', 'private')} |"
            )
            if _default({**c, "repack_auto_on": auto_on}):
                verdicts.append(
                    f"- {tag}, contexts {ctx['proxy']} / {ctx.get('llama_server')}: "
                    f"{c['peak_pss_bytes'] / MIB:,.0f} MiB in all, {c['ratio']:.2f}x weights + "
                    f"KV ({'within' if c['within_target'] else 'over'} "
                    f"{r.get('target_ratio', TARGET)}x)"
                )
    lines += [
        "",
        "The default server here (`dynamic`, repack off by auto's choice):",
        "",
        *verdicts,
        "",
        "Measured on a shared 2-core machine (memory moves little with load):",
        "",
        *sources,
        "",
    ]
    prefills = sorted(results.glob("repack-*.json"))
    if prefills:
        lines += [
            "## Prefill of both layouts",
            "",
            "The engine evaluating one 441-token prompt whole (every core, ubatch 256), repack on "
            "and off alternating after one untimed call each (tokens/s). Speed on a busy "
            "machine: the figures carry the load of other work where the load average says so.",
            "",
            "| model | on | off | off/on | letter logits apart | machine |",
            "|---|---|---|--:|--:|---|",
        ]
        for path in prefills:
            r = json.loads(path.read_text())
            t = r["tokens_per_s"]
            lines.append(
                f"| {r.get('model', path.stem)} | "
                f"{' / '.join(f'{x:.1f}' for x in t['on'])} | "
                f"{' / '.join(f'{x:.1f}' for x in t['off'])} | {r['off_over_on']:.2f}x | "
                f"{r['max_abs_logit_difference']:.3g} | {_machine(r)} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__)
    parser.add_argument("--table", action="store_true", help="write docs/memory.md")
    parser.add_argument("--out", type=Path, help="write the page here instead")
    args = parser.parse_args(argv)
    if not args.table:
        parser.error("give --table (the suites run through python -m bench)")
    (args.out or PAGE).write_text(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
