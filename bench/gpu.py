"""`python -m bench.gpu`: the decision path with full GPU offload, through the real server.

    python -m bench.gpu --model M.gguf --out gpu.json            # on the GPU host
    python -m bench.gpu --model M.gguf --out cpu.json --quick --gpu-layers 0   # dry run, CPU

Sections (each a key of the JSON written to --out):
- latency: single decisions with prompts of about 200, 1,000 and 4,000 tokens (each request its
  own evidence, so no prefix is reused): client-side p50/p95 and the engine's forward time;
- shared: 21 questions on one evidence in one shared request, against 21 single requests each
  on its own evidence (cold: every one pays its prefill);
- throughput: decisions/s with 1, 4 and 16 concurrent clients (~200-token prompts);
- agreement: the same prompts on the GPU server and on a CPU server on the same machine
  (n_gpu_layers 0 and CUDA_VISIBLE_DEVICES empty, so ggml offloads no matrix either): the largest
  |difference| in a probability and in a logit, and how often the argmax agrees; the prompts are
  the README's routing example and sized ticket texts, and with --jevbench the JevBench tasks of
  that file through the System One route (`jevbench_agreement`: per label probability, argmax
  flips); with --quantized the same again on a second (quantized) model, whose matrix products
  take other GPU kernels than F16's (`quantized`);
- jevbench: with --jevbench, each task once through `POST /v1/systemone` on the GPU: client-side
  p50/p95, the figure the AWS SemIf sample reports for its GPU;
- memory: a server with chat and decisions, both fully offloaded: what nvidia-smi says each
  process holds on the GPU, against what semif_proxy.model.gpu_memory estimates for it, and each
  process's host memory (RSS, PSS, private; bench.common.memory_kb).

Evidence texts are built from English words (semif_proxy.model.tiny_gguf.WORDS) and sized by the
server's own token counts, so the sizes hold for a real model as for a generated one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import machine, memory_kb, post, summary
from semif_proxy.eval.jevbench import Task, label_probabilities, read_tasks
from semif_proxy.model.tiny_gguf import WORDS
from semif_proxy.testing.server import ProxyProcess

QUESTION = "Which support queue should handle this ticket?"
OPTIONS = [
    {"id": "billing", "description": "Billing, invoices, refunds and payment problems"},
    {"id": "account_access", "description": "Login, password reset and account access problems"},
    {"id": "shipping", "description": "Delivery, tracking and shipping problems"},
    {"id": "product", "description": "Broken items, damaged product and returns"},
]
PLAIN = [w for w in WORDS if w.isalpha()]
# The README's decision example, word for word (tests/test_readme_examples.py runs it on the CPU).
ROUTING = {
    "id": "route-1",
    "state": (
        "Customer email: I requested a password reset three times but the email never arrives. "
        "I cannot log in."
    ),
    "question": QUESTION,
    "options": OPTIONS[:3],
}


def log(message: str) -> None:
    sys.stderr.write(f"bench.gpu: {message}\n")
    sys.stderr.flush()


def evidence(words: int, seed: int) -> str:
    """`words` words of ticket-like text, different for every seed."""
    rng = random.Random(seed)
    out = ["Case", f"{seed}:"]
    while len(out) < words:
        sentence = rng.sample(PLAIN, rng.randint(6, 14))
        out += [sentence[0].capitalize(), *sentence[1:-1], sentence[-1] + "."]
    return " ".join(out[:words])


def decision(words: int, seed: int, n_options: int = 3, question: str = QUESTION) -> dict:
    options = OPTIONS[seed % len(OPTIONS) :] + OPTIONS[: seed % len(OPTIONS)]
    return {
        "id": f"d{seed}",
        "state": evidence(words, seed),
        "question": question,
        "options": options[:n_options],
    }


class Server:
    def __init__(self, model: Path, env: dict[str, str], log_path: Path | None) -> None:
        self.proc = ProxyProcess(model, env, log_path=log_path)

    def __enter__(self) -> ProxyProcess:
        return self.proc.start(timeout=600)

    def __exit__(self, *exc: object) -> None:
        self.proc.stop()


def ask(url: str, body: dict, timeout: float = 300.0) -> tuple[float, dict]:
    timed = post(url + "/v1/decisions", body, timeout=timeout)
    if timed.status != 200:
        raise RuntimeError(f"decision failed: {timed.status} {str(timed.body)[:500]}")
    return timed.seconds, timed.body


def words_for(url: str) -> tuple[float, float]:
    """Prompt tokens = a + b x evidence words, read off two probes (the server counts)."""
    _, short = ask(url, {"decision": decision(10, 10_001)})
    _, long = ask(url, {"decision": decision(400, 10_002)})
    t0, t1 = short["result"]["input_tokens"], long["result"]["input_tokens"]
    b = (t1 - t0) / 390
    return t0 - 10 * b, b


def words_for_tokens(fit: tuple[float, float], tokens: int) -> int:
    a, b = fit
    return max(1, round((tokens - a) / b))


def latency(url: str, fit: tuple[float, float], targets: list[int], n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for target in targets:
        words = words_for_tokens(fit, target)
        ask(url, {"decision": decision(words, 20_000 + target)})  # warm-up (graph reservation)
        client, forward, tokens = [], [], []
        for i in range(n):
            seconds, body = ask(url, {"decision": decision(words, 30_000 + target * 100 + i)})
            client.append(seconds)
            forward.append(body["result"]["timing"]["forward_seconds"])
            tokens.append(body["result"]["input_tokens"])
        out[str(target)] = {
            "input_tokens": summary([float(t) for t in tokens]),
            "client_seconds": summary(client),
            "forward_seconds": summary(forward),
            "client_values": client,  # each request's, for the docs' intervals
        }
        log(f"latency {target}: p50 {summary(client)['p50'] * 1000:.1f} ms")
    return out


def shared(url: str, fit: tuple[float, float], questions: int, tokens: int) -> dict[str, Any]:
    words = words_for_tokens(fit, tokens)
    base = decision(words, 40_000)
    many = [
        {**base, "id": f"q{i}", "question": f"{QUESTION} Answer {i}.", "options": OPTIONS[:3]}
        for i in range(questions)
    ]
    ask(url, {"decisions": many[:2]})  # warm-up
    shared_seconds, body = ask(url, {"decisions": many})
    singles = []
    for i in range(questions):
        cold = {**many[i], "state": f"Cold {i}. " + base["state"]}
        seconds, _ = ask(url, {"decision": cold})
        singles.append(seconds)
    out = {
        "questions": questions,
        "prefix_tokens": body["timing"].get("prefix_tokens"),
        "mode": body["timing"].get("mode"),
        "shared_seconds": shared_seconds,
        "shared_timing": body["timing"],
        "singles_seconds_total": sum(singles),
        "singles": summary(singles),
        "speedup": sum(singles) / shared_seconds if shared_seconds else None,
    }
    log(f"shared {questions}: {shared_seconds:.3f} s vs singles {sum(singles):.3f} s")
    return out


def throughput(
    url: str, fit: tuple[float, float], clients: list[int], seconds: float
) -> dict[str, Any]:
    words = words_for_tokens(fit, 200)
    out: dict[str, Any] = {}
    for n in clients:
        stop = time.monotonic() + seconds
        counter = iter(range(10**9))

        def client(k: int, stop: float = stop, counter: Any = counter) -> list[float]:
            done = []
            while time.monotonic() < stop:
                seed = 50_000_000 + next(counter)
                timed = post(url + "/v1/decisions", {"decision": decision(words, seed)})
                if timed.status == 200:
                    done.append(timed.seconds)
            return done

        started = time.monotonic()
        with ThreadPoolExecutor(n) as pool:
            results = list(pool.map(client, range(n)))
        elapsed = time.monotonic() - started
        latencies = [s for r in results for s in r]
        out[str(n)] = {
            "decisions": len(latencies),
            "seconds": elapsed,
            "decisions_per_second": len(latencies) / elapsed,
            "latency": summary(latencies),
        }
        log(f"throughput {n} clients: {len(latencies) / elapsed:.1f}/s")
    return out


def agreement_prompts(fit: tuple[float, float], n: int) -> list[dict]:
    sizes = [200, 1000]
    return [ROUTING] + [
        decision(words_for_tokens(fit, sizes[i % 2]), 60_000 + i, n_options=2 + i % 3)
        for i in range(n)
    ]


def collect(url: str, prompts: list[dict]) -> list[dict]:
    return [ask(url, {"decision": p})[1]["result"] for p in prompts]


def ask_systemone(url: str, task: Task) -> tuple[float, dict]:
    timed = post(url + "/v1/systemone", task.request(), timeout=300.0)
    if timed.status != 200:
        raise RuntimeError(f"{task.id}: {timed.status} {str(timed.body)[:500]}")
    return timed.seconds, timed.body["answers"]["q"]


def collect_tasks(url: str, tasks: list[Task]) -> tuple[list[float], list[dict]]:
    seconds, answers = [], []
    for task in tasks:
        s, answer = ask_systemone(url, task)
        seconds.append(s)
        answers.append(answer)
    return seconds, answers


def jevbench_latency(seconds: list[float], tasks: list[Task]) -> dict[str, Any]:
    """Each task asked once, one at a time, on the GPU server (its state cold: every task has
    its own)."""
    log(f"jevbench {len(tasks)} tasks: p50 {summary(seconds)['p50'] * 1000:.1f} ms")
    return {"tasks": len(tasks), "client_seconds": summary(seconds), "client_values": seconds}


def compare_tasks(tasks: list[Task], gpu: list[dict], cpu: list[dict]) -> dict[str, Any]:
    """Per task: the largest |difference| in a label's probability and whether the argmax label
    is the same (a noul answer's labels are yes and no)."""
    dp, flips = [], []
    for task, g, c in zip(tasks, gpu, cpu):
        pg, pc = label_probabilities(g), label_probabilities(c)
        dp.append(max(abs(pg[label] - pc[label]) for label in pg))
        if max(pg, key=pg.get) != max(pc, key=pc.get):
            flips.append(task.id)
    return {
        "tasks": len(tasks),
        "max_abs_dp": max(dp) if dp else None,
        "median_abs_dp": summary(dp)["p50"] if dp else None,
        "argmax_flips": flips,
        "per_task_dp": dict(zip([t.id for t in tasks], dp)),
    }


def compare(gpu: list[dict], cpu: list[dict]) -> dict[str, Any]:
    dp, dl, agree = [], [], 0
    for g, c in zip(gpu, cpu):
        dp.append(max(abs(a - b) for a, b in zip(g["probabilities"], c["probabilities"])))
        dl.append(max(abs(a - b) for a, b in zip(g["option_logits"], c["option_logits"])))
        pg, pc = g["probabilities"], c["probabilities"]
        agree += pg.index(max(pg)) == pc.index(max(pc))
    return {
        "prompts": len(gpu),
        "max_abs_dp": max(dp) if dp else None,
        "max_abs_dlogit": max(dl) if dl else None,
        "argmax_agreement": agree / len(gpu) if gpu else None,
        "per_prompt_dp": dp,
        "input_tokens": [g["input_tokens"] for g in gpu],
        "options": [len(g["probabilities"]) for g in gpu],
    }


def nvidia_smi(query: str, kind: str = "gpu") -> list[list[str]]:
    if not shutil.which("nvidia-smi"):
        return []
    flag = "--query-gpu" if kind == "gpu" else "--query-compute-apps"
    result = subprocess.run(
        ["nvidia-smi", f"{flag}={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return [[c.strip() for c in line.split(",")] for line in result.stdout.splitlines() if line]


def memory(model: Path, ctx: int, logs: Path | None) -> dict[str, Any]:
    from semif_proxy.model import gpu_memory

    shape = gpu_memory.ModelShape.from_file(model)
    procs = [
        gpu_memory.Process("the decision engine", -1, ctx),
        gpu_memory.server_process(["--ctx-size", str(ctx), "--n-gpu-layers", "999"], shape),
    ]
    estimate = {n.process.name: n.as_dict() for n in (gpu_memory.need(shape, p) for p in procs)}
    used_before = nvidia_smi("memory.used")
    env = {
        "SEMIF_N_GPU_LAYERS": "999",
        "SM_LLAMA_CPP_N_GPU_LAYERS": "999",
        "SEMIF_CTX_SIZE": str(ctx),
        "SM_LLAMA_CPP_CTX_SIZE": str(ctx),
    }
    with Server(model, env, logs / "memory.log" if logs else None) as server:
        health = server.call("GET", "/health").json()
        chat = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
        server.call("POST", "/v1/chat/completions", chat, timeout=120)
        ask(server.url, {"decision": decision(600, 70_000)})
        apps = nvidia_smi("pid,used_memory", kind="apps")
        used_after = nvidia_smi("memory.used")
        pids = {
            str(health.get("pid")): "the decision engine",
            str((health.get("llama_server") or {}).get("pid")): "llama-server",
        }
        host = {}
        for pid, name in pids.items():
            try:
                host[name] = memory_kb(int(pid))
            except (OSError, ValueError) as exc:  # a pid /health did not give
                host[name] = {"error": repr(exc)}
    measured = {pids.get(pid, f"pid {pid}"): int(mib) * (1 << 20) for pid, mib in apps}
    return {
        "ctx": ctx,
        "estimate": estimate,
        "measured_bytes": measured,
        "host_kb": host,
        "gpu_used_mib_before": used_before,
        "gpu_used_mib_after": used_after,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--logs", type=Path, help="folder for the servers' logs")
    parser.add_argument("--gpu-layers", default="999")
    parser.add_argument("--quick", action="store_true", help="few requests (the dry run)")
    parser.add_argument("--skip", default="", help="comma-separated sections to leave out")
    parser.add_argument(
        "--budget", type=float, default=0, help="seconds; sections not begun by then are skipped"
    )
    parser.add_argument(
        "--agreement-prompts",
        type=int,
        help="sized ticket texts compared GPU vs CPU, after the routing example "
        "(default: 12, 4 with --quick)",
    )
    parser.add_argument(
        "--jevbench",
        type=Path,
        help="a JevBench task file (JSON Lines of System One questions): their GPU latency and "
        "GPU-vs-CPU agreement (default: none)",
    )
    parser.add_argument(
        "--quantized",
        type=Path,
        help="a second model (e.g. the --model quantized to Q4_K_M): agreement on it too "
        "(default: none)",
    )
    args = parser.parse_args(argv)
    if args.jevbench is not None and not args.jevbench.is_file():
        parser.error(f"--jevbench: no such file: {args.jevbench}")
    if args.quantized is not None and not args.quantized.is_file():
        parser.error(f"--quantized: no such file: {args.quantized}")
    tasks = list(read_tasks([args.jevbench])) if args.jevbench else []
    skip = set(filter(None, args.skip.split(",")))
    quick = args.quick
    if quick:
        tasks = tasks[:4]
    targets = [200, 1000] if quick else [200, 1000, 4000]
    cores = str(os.cpu_count() or 1)
    result: dict[str, Any] = {
        "model": str(args.model),
        "machine": machine(),
        "gpu": nvidia_smi("name,memory.total,driver_version"),
        "gpu_layers": args.gpu_layers,
    }
    gpu_env = {
        "SEMIF_CHAT": "off",
        "SEMIF_N_GPU_LAYERS": args.gpu_layers,
        "SEMIF_CTX_SIZE": "8192",
        "SEMIF_MAX_DECISIONS": "64",
        "SEMIF_MAX_IN_FLIGHT": "16",
        "SEMIF_MAX_QUEUE": "64",
        "SEMIF_THREADS": cores,
    }

    def save() -> None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    def section(name: str, fn: Any, *fn_args: Any) -> Any:
        """One section; a failure is written down and the others still run (one GPU run)."""
        if name in skip:
            return None
        if args.budget and time.monotonic() - started > args.budget:
            result[name] = {"error": f"not run: the {args.budget:.0f} s budget was spent"}
            save()
            return None
        try:
            result[name] = fn(*fn_args)
        except Exception as exc:  # recorded; the other sections still run
            log(f"{name} failed: {exc!r}")
            result[name] = {"error": repr(exc)}
        save()
        return result[name]

    started = time.monotonic()
    prompts: list[dict] = []
    # Per model: the GPU server's answers to `prompts` and to the JevBench tasks.
    gpu_answers: dict[Path, tuple[list[dict], list[dict]]] = {}

    sized = args.agreement_prompts
    n_sized = sized if sized is not None else 4 if quick else 12

    def gpu_side(url: str, model: Path) -> dict[str, int]:
        """The GPU server's answers to the agreement prompts (made here if the first model's
        server gave none: it may refuse where a quantized one serves)."""
        nonlocal prompts
        if not prompts:
            prompts = agreement_prompts(words_for(url), n_sized)
        gpu_answers[model] = (collect(url, prompts), collect_tasks(url, tasks)[1])
        return {"prompts": len(prompts), "tasks": len(tasks)}

    def on_gpu() -> dict[str, Any]:
        with Server(args.model, gpu_env, args.logs / "bench.log" if args.logs else None) as gpu:
            fit = words_for(gpu.url)
            section("latency", latency, gpu.url, fit, targets, 3 if quick else 15)
            section("shared", shared, gpu.url, fit, 21, 1000)
            if tasks:

                def timed_tasks() -> dict[str, Any]:
                    # Warmed on a state no task has, so every timed task's state stays cold.
                    warm = Task(
                        "warm-up", {**tasks[0].row, "state": "Warm-up. " + tasks[0].row["state"]}
                    )
                    ask_systemone(gpu.url, warm)
                    return jevbench_latency(collect_tasks(gpu.url, tasks)[0], tasks)

                section("jevbench", timed_tasks)
            if "agreement" not in skip:
                section("agreement_gpu", gpu_side, gpu.url, args.model)
            section("throughput", throughput, gpu.url, fit, [1, 4, 16], 2.0 if quick else 5.0)
        return {"tokens_per_word": fit[1], "prompt_tokens_at_zero_words": fit[0]}

    section("server", on_gpu)

    def agreement(model: Path) -> dict[str, Any]:
        if model != args.model:
            log_path = args.logs / "quantized.log" if args.logs else None
            with Server(model, gpu_env, log_path) as gpu:
                gpu_side(gpu.url, model)
        if model not in gpu_answers:
            raise RuntimeError("no GPU results to compare")
        gpu_results, gpu_tasks = gpu_answers[model]
        cpu_env = {**gpu_env, "SEMIF_N_GPU_LAYERS": "0", "CUDA_VISIBLE_DEVICES": ""}
        cpu_log = args.logs / f"cpu-{model.stem}.log" if args.logs else None
        side = "n_gpu_layers 0, no GPU visible"

        def on_cpu() -> tuple[list[dict], list[dict]]:
            with Server(model, cpu_env, cpu_log) as cpu:
                return collect(cpu.url, prompts), collect_tasks(cpu.url, tasks)[1]

        try:
            cpu_results, cpu_tasks = on_cpu()
        except RuntimeError as exc:
            if "exited with" not in str(exc):  # only a CUDA build that will not start at all
                raise
            log(f"CPU server without a visible GPU failed ({exc}); n_gpu_layers 0 alone")
            side = "n_gpu_layers 0 (GPU visible: ggml may offload large matrix products)"
            cpu_env.pop("CUDA_VISIBLE_DEVICES")
            cpu_results, cpu_tasks = on_cpu()
        out = {"model": model.name, "cpu_side": side, **compare(gpu_results, cpu_results)}
        log(f"agreement: max |dp| {out['max_abs_dp']}, argmax {out['argmax_agreement']}")
        if tasks:
            out["jevbench"] = compare_tasks(tasks, gpu_tasks, cpu_tasks)
            log(
                f"jevbench agreement: max |dp| {out['jevbench']['max_abs_dp']}, "
                f"{len(out['jevbench']['argmax_flips'])} argmax flips"
            )
        return out

    section("agreement", agreement, args.model)
    if args.quantized is not None and "agreement" not in skip:
        section("quantized", agreement, args.quantized)
    section("memory", memory, args.model, 8192, args.logs)
    result["seconds"] = time.monotonic() - started
    save()
    log(f"done in {result['seconds']:.0f} s: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
