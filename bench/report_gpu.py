"""docs/benchmarks.md's GPU section, from bench/results/gpu-*.json (bench/gpu.py's output as the
GPU check wrote it on a GPU host, copied here with the device in its name).

Latency medians carry a bootstrap 95 % interval over the requests (resampled); the rest are
single runs and say so. The AWS SemIf sample's GPU figures stand beside ours with what differs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.readouts_stats import median_interval

# The AWS SemIf sample's README: its GPU decision latency on the JevBench tasks, an L40S-class
# instance, its own model. Kept beside ours with that said, not as a like-for-like comparison.
AWS_SAMPLE_GPU = {"p50": 0.352, "p95": 0.599, "hardware": "L40S-class (g6e)"}


def num(value: float | None, spec: str) -> str:
    """A figure, or a dash where the run had none to give (e.g. no prompt was compared)."""
    return "—" if value is None else format(value, spec)


def ms_ci(values: list[float]) -> str:
    point, lo, hi = median_interval(values)
    if lo is None or hi is None:
        return f"{point * 1000:.1f} ms (no interval: {len(values)} requests)"
    return f"{point * 1000:.1f} ms [{lo * 1000:.1f}, {hi * 1000:.1f}]"


def _ok(data: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = data.get(key)
    return value if isinstance(value, dict) and "error" not in value else None


def device(data: dict[str, Any]) -> str:
    """'NVIDIA H200, 143771 MiB, driver 580.159.04' from nvidia-smi's row."""
    rows = data.get("gpu") or []
    if not rows:
        return "no GPU recorded"
    name, memory, driver = (rows[0] + ["?", "?", "?"])[:3]
    return f"{name}, {memory} MiB, driver {driver}"


def section(
    files: list[Path], get: Callable[[str], dict[str, Any] | None], line: Callable[[], str]
) -> list[str]:
    out = ["## GPU", ""]
    if not files:
        return [*out, "No GPU results yet (`scripts/gpu_check.sh` writes them; docs/gpu.md).", ""]
    for path in files:
        data = get(path.name)
        if data is None:
            continue
        out += _one(data)
        out += ["", line(), ""]
    return out


def _check(data: dict[str, Any]) -> list[str]:
    """What the GPU check itself found (scripts/gpu_env.py record): the suite with full offload
    and the exactness self-check, before any figure."""
    check = data.get("check")
    if not check:
        return []
    tests = check.get("tests") or {}
    out = ["| | on this GPU |", "|---|---|"]
    for run in check.get("exactness") or []:
        result = run.get("check") or {}
        verdict = "passed" if result.get("passed") else "**failed: the engine refuses decisions**"
        out.append(
            f"| exactness self-check at start, {run.get('model', '?')}, "
            f"{run.get('gpu_layers', '?')} layers offloaded | {verdict}; largest letter-logit "
            f"difference {num(result.get('max_abs_difference'), '.3g')} (allowed "
            f"{num(result.get('tolerance'), 'g')}) |"
        )
    if tests:
        bad = tests["failures"] + tests["errors"]
        passed = tests["tests"] - bad - tests["skipped"]
        cut = "; cut at its time budget" if check.get("timed_out") else ""
        serial = "" if check.get("serial_run") else "; the `serial` tests not reached"
        out.append(
            f"| `not slow` suite, full offload, generated F16 model | {passed} passed, "
            f"{tests['failures']} failed, {tests['errors']} errors, {tests['skipped']} skipped in "
            f"{tests['time']:.0f} s{cut}{serial} |"
        )
    refusals = check.get("self_check_refusals") or []
    if refusals:
        lo = min(r["max_abs_difference"] for r in refusals)
        hi = max(r["max_abs_difference"] for r in refusals)
        allowed = refusals[0]["tolerance"]
        out.append(
            "| exactness self-check (split against one-piece letter logits) | **failed: "
            f"{lo:.3g} to {hi:.3g} against {allowed:g} allowed, so the engine refused decisions** "
            f"({len(refusals)} distinct results over the suite's models and settings) |"
        )
    exceeded = check.get("tolerance_exceeded") or []
    if exceeded:
        out.append(
            "| engine tests' GPU tolerance (1e-3 on logits) | exceeded in "
            f"{len(exceeded)} comparisons, by {min(exceeded):.3g} to {max(exceeded):.3g} |"
        )
    out.append(f"| steps that failed | {check.get('failed_steps', '?')} |")
    return [*out, ""]


def _model(data: dict[str, Any]) -> str:
    model = (data.get("check") or {}).get("model") or {}
    if model.get("params"):
        return f"a generated {model['params'] / 1e6:.0f}M-parameter llama in {model['dtype']}"
    return "a generated llama"


def _one(data: dict[str, Any]) -> list[str]:
    cores = data.get("machine", {}).get("cores", "?")
    measured = [k for k in ("latency", "shared", "jevbench", "throughput") if _ok(data, k)]
    also = " and its Q4_K_M quantization" if _ok(data, "quantized") else ""
    intro = (
        f"One run of `scripts/gpu_check.sh` on **{device(data)}** ({cores} host cores), every "
        f"layer offloaded, on {_model(data)}{also} with random weights "
        "(`semif_proxy.model.tiny_gguf`; a real GGUF is too big to carry to that machine): its "
        "speed stands for a model of that size, its answers mean nothing."
    )
    if measured:
        intro += (
            " Medians carry a bootstrap 95 % interval over the requests; everything else is one "
            "run."
        )
    out = [intro, "", *_check(data)]
    latency = _ok(data, "latency")
    if latency:
        out += [
            "| prompt tokens (median) | requests | p50 | p95 | engine forward p50 |",
            "|---|---|---|---|---|",
        ]
        for row in latency.values():
            values = row.get("client_values") or []
            p50 = ms_ci(values) if values else f"{row['client_seconds']['p50'] * 1000:.1f} ms"
            out.append(
                f"| {row['input_tokens']['p50']:.0f} | {row['client_seconds']['n']} | {p50} | "
                f"{row['client_seconds']['p95'] * 1000:.1f} ms | "
                f"{row['forward_seconds']['p50'] * 1000:.1f} ms |"
            )
        out.append("")
    jev = _ok(data, "jevbench")
    if jev:
        aws = AWS_SAMPLE_GPU
        values = jev.get("client_values") or []
        p50 = ms_ci(values) if values else f"{jev['client_seconds']['p50'] * 1000:.1f} ms"
        out += [
            "JevBench easy tasks, each once through `POST /v1/systemone`, one at a time, beside "
            "the GPU figures the AWS SemIf sample reports for the JevBench tasks. **Different "
            "model and hardware**: theirs is a real decision model on an "
            f"{aws['hardware']} GPU, ours the generated stand-in above on this card; the rows "
            "say what a request costs on each, not which server is faster.",
            "",
            "| server | GPU | model | tasks | p50 | p95 |",
            "|---|---|---|---|---|---|",
            f"| semif-proxy | {device(data).split(',')[0]} | generated ~300M F16 | "
            f"{jev['tasks']} | {p50} | "
            f"{jev['client_seconds']['p95'] * 1000:.1f} ms |",
            f"| AWS SemIf sample (its README) | {aws['hardware']} | its own | JevBench | "
            f"{aws['p50'] * 1000:.0f} ms | {aws['p95'] * 1000:.0f} ms |",
            "",
        ]
    shared = _ok(data, "shared")
    if shared and shared.get("speedup") is not None:
        out += [
            f"Shared state: {shared['questions']} questions on one ~{shared.get('prefix_tokens')}"
            f"-token state in one request took {shared['shared_seconds'] * 1000:.0f} ms; the same "
            f"questions as cold single requests {shared['singles_seconds_total'] * 1000:.0f} ms "
            f"in all ({shared['speedup']:.1f}x; one run each, no interval).",
            "",
        ]
    throughput = _ok(data, "throughput")
    if throughput and all("decisions_per_second" in row for row in throughput.values()):
        out += [
            "| concurrent clients (~200-token prompts) | decisions/s | p50 | p95 |",
            "|---|---|---|---|",
        ]
        for n, row in throughput.items():
            out.append(
                f"| {n} | {row['decisions_per_second']:.1f} | "
                f"{row['latency']['p50'] * 1000:.1f} ms | {row['latency']['p95'] * 1000:.1f} ms |"
            )
        out += [
            "",
            f"Each row one {next(iter(throughput.values()))['seconds']:.0f}-second window.",
            "",
        ]
    agreements = [a for a in (_ok(data, "agreement"), _ok(data, "quantized")) if a]
    if agreements:
        out += [
            "GPU against CPU on the same machine (a second server with no layer offloaded and no "
            "GPU visible): the README's routing example and ticket texts of ~200 and ~1,000 "
            "tokens through `/v1/decisions`, and the JevBench easy tasks through "
            "`/v1/systemone`.",
            "",
            "| model | prompts | max \\|Δp\\| | max \\|Δlogit\\| | argmax agrees | JevBench tasks "
            "| max \\|Δp\\| | argmax flips |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for a in agreements:
            jv = a.get("jevbench") or {}
            flips = jv.get("argmax_flips")
            out.append(
                f"| {a.get('model', '?')} | {a['prompts']} | {num(a.get('max_abs_dp'), '.1e')} | "
                f"{num(a.get('max_abs_dlogit'), '.1e')} | "
                f"{num(a.get('argmax_agreement'), '.0%')} | {jv.get('tasks', '—')} | "
                f"{num(jv.get('max_abs_dp'), '.1e')} | "
                f"{len(flips) if flips is not None else '—'} |"
            )
        out.append("")
    memory = _ok(data, "memory")
    if memory:
        out += [
            f"Memory with chat and decisions both fully offloaded (contexts {memory['ctx']}): "
            "what `gpu_memory` estimates for each process, what `nvidia-smi` says it holds, and "
            "its host memory.",
            "",
            "| process | GPU, estimated | GPU, nvidia-smi | host RSS | host private |",
            "|---|---|---|---|---|",
        ]
        for name, est in memory["estimate"].items():
            got = memory["measured_bytes"].get(name)
            host = memory.get("host_kb", {}).get(name, {})
            out.append(
                f"| {name} | {est['total_bytes'] / 2**30:.2f} GiB | "
                + (f"{got / 2**30:.2f} GiB" if got else "not read")
                + " | "
                + (f"{host['rss'] / 2**20:.2f} GiB" if "rss" in host else "—")
                + " | "
                + (f"{host['private'] / 2**20:.2f} GiB" if "private" in host else "—")
                + " |"
            )
        out.append("")
    failed = [k for k, v in data.items() if isinstance(v, dict) and "error" in v]
    if failed:
        out += [
            "Not measured in this run: "
            + ", ".join(f"{k} ({data[k]['error']})" for k in failed)
            + ".",
            "",
        ]
    return out
