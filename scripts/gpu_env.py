"""Helpers of scripts/gpu_check.sh that are easier in Python than in bash.

python scripts/gpu_env.py imports              # versions of what the suite imports
python scripts/gpu_env.py runtime-dirs         # where libcudart/libcublas .so.13 are
python scripts/gpu_env.py native [--need-gpu]  # the extension's build and devices
python scripts/gpu_env.py summary --out DIR [--failed "a b"] [--seconds N]
python scripts/gpu_env.py merge-junit INTO FROM  # FROM's test suites join INTO (one file back)
python scripts/gpu_env.py exactness --model M [--gpu-layers 999]  # the engine's self-check
python scripts/gpu_env.py record --out DIR --results F --commit C  # a check's files as results
"""

from __future__ import annotations

import argparse
import glob
import importlib
import importlib.metadata
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

# module to import -> distribution whose version is shown
MODULES = {
    "aiohttp": "aiohttp",
    "pydantic": "pydantic",
    "jinja2": "jinja2",
    "numpy": "numpy",
    "pytest": "pytest",
    "pytest_aiohttp": "pytest-aiohttp",
    "pytest_asyncio": "pytest-asyncio",
    "pytest_timeout": "pytest-timeout",
    "xdist": "pytest-xdist",
    "hypothesis": "hypothesis",
    "gguf": "gguf",
    "typesafe_sdk": "typesafe-sdk",
    "backports.zstd": "backports.zstd",
    "scikit_build_core": "scikit-build-core",
    "pybind11": "pybind11",
}
CUDA_LIBS = ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcuda.so.1")
# Where drivers put libcuda.so.1 when the loader's cache does not name it (containers mount it).
DRIVER_DIRS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/wsl/lib")


def imports() -> int:
    print("python", sys.version.split()[0], sys.executable)
    missing = 0
    for name, dist in MODULES.items():
        try:
            importlib.import_module(name)
            print(f"  {name} {importlib.metadata.version(dist)}")
        except Exception as exc:
            missing += 1
            print(f"  {name} MISSING ({exc})")
    return 1 if missing else 0


def runtime_dirs() -> list[str]:
    """Folders that hold the CUDA 13 runtime and cuBLAS: the toolkit's, then those of the
    nvidia-* wheels of any folder on sys.path (PyTorch's environment on the GPU host), and a
    mounted driver's."""
    candidates = ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]
    candidates += DRIVER_DIRS
    for base in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cublas/lib", "nvidia/cuda_runtime/lib"):
            candidates.append(os.path.join(base, sub))
    out: list[str] = []
    for d in candidates:
        if d not in out and any(glob.glob(os.path.join(d, lib)) for lib in CUDA_LIBS):
            out.append(d)
    return out


def native(need_gpu: bool) -> int:
    from semif_proxy.engine import native as n

    info = n.build_info()
    print(f"llama.cpp build {info['llama_cpp_build']}, gpu offload {info['gpu_offload']}")
    for d in n.devices():
        free, total = int(d.get("memory_free", 0)) / 2**30, int(d.get("memory_total", 0)) / 2**30
        print(f"  {d['type']}: {d['name']} {d.get('description', '')} {free:.1f}/{total:.1f} GiB")
    if need_gpu and not n.gpu_devices():
        print("no GPU device in this extension (a CPU build, or CUDA did not initialise)")
        return 1
    return 0


def _suites(path: Path) -> list[ET.Element]:
    """The test suites of a JUnit file; none when it is missing or unreadable (a pytest killed
    before it wrote one)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    return [root] if root.tag == "testsuite" else root.findall("testsuite")


def exactness(model: Path, gpu_layers: int) -> int:
    """The engine's load-time exactness self-check on `model` (engine/exactness.py): the split
    a served decision takes against its one-piece evaluation, as the engine will judge it."""
    from semif_proxy.engine.worker import DecisionEngine
    from semif_proxy.settings import load_settings

    settings = load_settings({}, model=str(model), n_gpu_layers=gpu_layers, chat=False)
    engine = DecisionEngine.load(settings)
    try:
        check = engine.exactness
        shown = check.as_dict() if check is not None else None
        print(json.dumps({"model": model.name, "gpu_layers": gpu_layers, "check": shown}))
        return 0 if check is not None and check.passed else 1
    finally:
        engine.close()


def _junit(path: Path) -> dict[str, Any]:
    """Counts summed over the file's suites (the parallel part and the serial part)."""
    suites = _suites(path)
    if not suites:
        return {}
    keys = ("tests", "failures", "errors", "skipped")
    counts = {k: sum(int(suite.get(k, 0)) for suite in suites) for k in keys}
    failed = []
    for suite in suites:
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(f"{case.get('classname')}::{case.get('name')}")
    seconds = sum(float(suite.get("time", 0)) for suite in suites)
    return {**counts, "time": seconds, "failed": failed}


SELF_CHECK = re.compile(
    r"differ from its one-piece evaluation by up to ([0-9.e+-]+) \(allowed ([0-9.e+-]+)"
)
ALLCLOSE = re.compile(r"Max absolute difference among violations: ([0-9.e+-]+)")


def _json_lines(text: str, key: str) -> list[dict[str, Any]]:
    """The JSON objects logged one per line that hold `key` (step 5's model, step 6b's checks)."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and f'"{key}"' in line:
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def record(out: Path, results: Path, commit: str | None) -> int:
    """A GPU check's files (what the device returned) as one results file for docs/benchmarks.md
    (bench/report_gpu.py): bench/gpu.py's sections where it measured them, and `check`: the
    device, the tests' counts, every distinct exactness self-check refusal and every GPU
    tolerance a test found exceeded, read from pytest.log."""
    bench_path = out / "bench_gpu.json"
    data: dict[str, Any] = json.loads(bench_path.read_text()) if bench_path.is_file() else {}
    smi_path = out / "nvidia-smi.txt"
    smi = smi_path.read_text().strip().splitlines()[-1:] if smi_path.is_file() else []
    fields = [c.strip() for c in smi[0].split(",")] if smi else []
    cap = None
    if len(fields) == 5:  # name, memory.total, memory.used, driver_version, compute_cap
        data["gpu"] = [[fields[0], fields[1].replace(" MiB", ""), fields[3]]]
        cap = fields[4]
    else:  # a dry run, or no GPU seen: nothing to name
        data["gpu"] = []
    log = (out / "pytest.log").read_text() if (out / "pytest.log").is_file() else ""
    check_log = (out / "gpu_check.log").read_text()
    junit = out / "junit.xml"
    suites = _suites(junit)
    stamp = suites[0].get("timestamp", "") if suites else ""
    machine = data.get("machine") or {}
    cores = re.search(r"(\d+) cores;", check_log)
    cpu = re.search(r"cpu: CPU (.+?) [0-9.]+/[0-9.]+ GiB", check_log)
    data["machine"] = {
        **machine,
        "date": machine.get("date") or (stamp[:16] + "Z" if stamp else None),
        "cores": machine.get("cores") or (int(cores.group(1)) if cores else None),
        "cpu": machine.get("cpu") or (cpu.group(1) if cpu else "?"),
    }
    stamped = re.search(r"commit: (\S+)", check_log)
    data["machine"]["commit"] = stamped.group(1) if stamped else commit
    refusals = sorted({(float(a), float(b)) for a, b in SELF_CHECK.findall(log)})
    failed = re.search(r"failed: (.*)$", check_log.strip().splitlines()[-1])
    models = [m for m in _json_lines(check_log, "params") if "path" in m]
    data["check"] = {
        "model": models[0] if models else None,
        "exactness": _json_lines(check_log, "check"),
        "compute_capability": cap,
        "tests": _junit(junit),
        "timed_out": "timed out" in check_log,
        "serial_run": "serial tests get" in check_log,
        "failed_steps": failed.group(1) if failed else "?",
        "self_check_refusals": [{"max_abs_difference": a, "tolerance": b} for a, b in refusals],
        "tolerance_exceeded": sorted(float(x) for x in ALLCLOSE.findall(log)),
    }
    for key in ("latency", "shared", "jevbench", "throughput", "agreement", "quantized", "memory"):
        if key not in data:
            why = "bench/gpu.py wrote no figure for it"
            if refusals:
                why += " (in the suite the engine refused decisions: exactness self-check)"
            data[key] = {"error": f"not measured: {why}"}
    results.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {results}")
    return 0


def merge_junit(into: Path, other: Path) -> int:
    """`other`'s suites appended to `into` (written as <testsuites>); `into` made from `other`
    alone when it has none."""
    mine, theirs = _suites(into), _suites(other)
    if not theirs:
        print(f"merge-junit: nothing to merge from {other}", file=sys.stderr)
        return 0
    root = ET.Element("testsuites")
    root.extend(mine + theirs)
    ET.ElementTree(root).write(into, encoding="utf-8", xml_declaration=True)
    return 0


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def summary(out: Path, failed: str, seconds: str) -> int:
    lines = ["# GPU check", ""]
    smi = out / "nvidia-smi.txt"
    if smi.is_file():
        lines += ["GPU: " + (smi.read_text().strip().splitlines() or ["?"])[-1], ""]
    lines += [f"Finished in {seconds} s. Failed steps: {failed or 'none'}.", ""]
    tests = _junit(out / "junit.xml")
    if tests:
        lines += [
            f"Tests: {tests['tests']} collected, {tests['failures']} failed, "
            f"{tests['errors']} errors, {tests['skipped']} skipped, {tests['time']:.0f} s.",
            *[f"- FAILED {name}" for name in tests["failed"]],
            "",
        ]
    bench_path = out / "bench_gpu.json"
    bench = json.loads(bench_path.read_text()) if bench_path.is_file() else {}
    if "latency" in bench and "error" not in bench["latency"]:
        lines += ["| prompt tokens (target) | actual p50 | p50 ms | p95 ms | forward p50 ms |"]
        lines += ["|---|---|---|---|---|"]
        for target, row in bench["latency"].items():
            lines.append(
                f"| {target} | {row['input_tokens']['p50']:.0f} | "
                f"{_ms(row['client_seconds']['p50'])} | {_ms(row['client_seconds']['p95'])} | "
                f"{_ms(row['forward_seconds']['p50'])} |"
            )
        lines.append("")
    if "shared" in bench and "error" not in bench["shared"]:
        s = bench["shared"]
        lines.append(
            f"Shared state, {s['questions']} questions: {s['shared_seconds']:.3f} s in one request"
            f" vs {s['singles_seconds_total']:.3f} s as cold singles (x{s['speedup']:.1f})."
        )
    if "throughput" in bench and "error" not in bench["throughput"]:
        rates = ", ".join(
            f"{n} clients {row['decisions_per_second']:.1f}/s"
            for n, row in bench["throughput"].items()
        )
        lines.append(f"Decisions/s: {rates}.")
    if "jevbench" in bench and "error" not in bench["jevbench"]:
        j = bench["jevbench"]
        lines.append(
            f"JevBench, {j['tasks']} tasks through /v1/systemone: p50 "
            f"{_ms(j['client_seconds']['p50'])} ms, p95 {_ms(j['client_seconds']['p95'])} ms."
        )
    for key in ("agreement", "quantized"):
        if key in bench and "error" not in bench[key]:
            a = bench[key]
            lines.append(
                f"GPU vs CPU, {a.get('model', 'the model')}, {a['prompts']} prompts: max |dp| "
                f"{_num(a['max_abs_dp'], '.2e')}, max |dlogit| {_num(a['max_abs_dlogit'], '.2e')}"
                f", argmax agreement {_num(a['argmax_agreement'], '.0%')}."
            )
            if "jevbench" in a:
                jv = a["jevbench"]
                lines.append(
                    f"  JevBench, {jv['tasks']} tasks: max |dp| {_num(jv['max_abs_dp'], '.2e')}, "
                    f"argmax flips {len(jv['argmax_flips'])} {jv['argmax_flips'] or ''}".rstrip()
                    + "."
                )
    if "memory" in bench and "error" not in bench["memory"]:
        m = bench["memory"]
        for name, est in m["estimate"].items():
            got = m["measured_bytes"].get(name)
            shown = f"{got / 2**30:.2f} GiB" if got else "not read"
            host = m.get("host_kb", {}).get(name, {})
            rss = f", host RSS {host['rss'] / 2**20:.2f} GiB" if "rss" in host else ""
            lines.append(
                f"Memory, {name}: estimated {est['total_bytes'] / 2**30:.2f} GiB, "
                f"nvidia-smi {shown}{rss}."
            )
    for key in ("latency", "shared", "jevbench", "throughput", "agreement", "quantized", "memory"):
        if isinstance(bench.get(key), dict) and "error" in bench[key]:
            lines.append(f"bench {key} failed: {bench[key]['error']}")
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("imports")
    sub.add_parser("runtime-dirs")
    p_native = sub.add_parser("native")
    p_native.add_argument("--need-gpu", action="store_true")
    p_summary = sub.add_parser("summary")
    p_summary.add_argument("--out", type=Path, required=True)
    p_summary.add_argument("--failed", default="")
    p_summary.add_argument("--seconds", default="?")
    p_exact = sub.add_parser("exactness")
    p_exact.add_argument("--model", type=Path, required=True)
    p_exact.add_argument("--gpu-layers", type=int, default=999)
    p_record = sub.add_parser("record")
    p_record.add_argument("--out", type=Path, required=True, help="the check's returned files")
    p_record.add_argument("--results", type=Path, required=True, help="bench/results/gpu-*.json")
    p_record.add_argument(
        "--commit", help="the commit the check ran, where its log does not say (default: none)"
    )
    p_merge = sub.add_parser("merge-junit")
    p_merge.add_argument("into", type=Path)
    p_merge.add_argument("other", type=Path)
    args = parser.parse_args(argv)
    if args.command == "exactness":
        return exactness(args.model, args.gpu_layers)
    if args.command == "record":
        return record(args.out, args.results, args.commit)
    if args.command == "merge-junit":
        return merge_junit(args.into, args.other)
    if args.command == "imports":
        return imports()
    if args.command == "runtime-dirs":
        print(":".join(runtime_dirs()))
        return 0
    if args.command == "native":
        return native(args.need_gpu)
    return summary(args.out, args.failed, args.seconds)


if __name__ == "__main__":
    raise SystemExit(main())
