"""Shared pieces of the benchmarks: a server to measure, timed HTTP calls, statistics, memory."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semif_proxy.progress import bar
from semif_proxy.testing.server import ProxyProcess

RESULTS = Path(__file__).resolve().parent / "results"
# Intervals (bench/report.py and the suites that keep their own): bootstrap resamples, a fixed
# seed (the same files give the same intervals, byte for byte), and the fewest pairs that get
# one (a bootstrap of 3 pairs says nothing).
BOOTSTRAP = 10_000
SEED = 20261201
MIN_PAIRS = 10


@dataclass
class Timed:
    status: int
    seconds: float
    body: Any


def post(
    url: str, body: Any, timeout: float = 600.0, headers: dict[str, str] | None = None
) -> Timed:
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    elapsed = time.perf_counter() - start
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = raw.decode("utf-8", "replace")
    return Timed(status, elapsed, parsed)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return json.loads(resp.read())


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": pct(values, 0.5),
        "p95": pct(values, 0.95),
        "max": max(values) if values else float("nan"),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


def memory_kb(pid: int) -> dict[str, int]:
    """RSS, PSS, private and peak RSS (kB). PSS splits the mmap'ed GGUF pages between the
    processes that share them, so proxy + llama-server PSS adds up to what the machine really
    holds; private is what this process alone holds (its KV cache, buffers, heap)."""
    out: dict[str, int] = {"private": 0}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            out[key.lower()] = int(rest.split()[0])
        elif key in ("Private_Clean", "Private_Dirty"):
            out["private"] += int(rest.split()[0])
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            out["peak_rss"] = int(line.split()[1])
    return out


def machine() -> dict[str, Any]:
    model_name = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model_name = line.split(":", 1)[1].strip()
            break
    return {
        "cpu": model_name,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        # When and what: the code measured changes between runs on the same machine and day.
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "commit": _commit(),
    }


def _commit() -> str | None:
    """The checkout's commit, with "+changes" when the tree differs from it; None outside git."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
        )
    except OSError:
        return os.environ.get("SEMIF_BENCH_COMMIT") or None
    if head.returncode != 0:
        # A copy without .git (the GPU host gets the working tree alone): the caller says.
        return os.environ.get("SEMIF_BENCH_COMMIT") or None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


_BARS: dict[str, Any] = {}


def progress(done: int, total: int, label: str) -> None:
    """`done` of `total` for the suite named `label`: its bar (semif_proxy.progress: tqdm on
    stderr, nothing off a terminal), closed once done reaches total."""
    shown = _BARS.get(label)
    if shown is None or shown.total != total or done < shown.n:
        if shown is not None:
            shown.close()
        shown = _BARS[label] = bar(total=total, desc=label)
    shown.update(done - shown.n)
    if done >= total:
        shown.close()
        del _BARS[label]


def start_server(model: Path, env: dict[str, str | None] | None = None) -> ProxyProcess:
    # The defaults a user gets (threads, CPU sharing, parallel slots), except: contexts large
    # enough for the longest states measured, and a request timeout that lets a 4,000-token
    # cold state finish on 2 cores (the default 55 s is SageMaker's real-time cut), and no
    # bias correction, as when the results files were measured (yes/no questions are corrected
    # by default since; bench.readouts measures what the correction changes).
    base: dict[str, str | None] = {
        "SEMIF_BIAS_CORRECTION": "none",
        "SEMIF_THREADS": None,
        "SM_LLAMA_CPP_PARALLEL": None,
        "SM_LLAMA_CPP_CTX_SIZE": "8192",
        "SEMIF_CTX_SIZE": "8192",
        "SEMIF_MAX_DECISIONS": "64",
        "SEMIF_REQUEST_TIMEOUT": "900",
    }
    server = ProxyProcess(model, {**base, **(env or {})}).start(timeout=300)
    settled(server.url)
    return server


def settled(url: str, timeout: float = 300.0) -> None:
    """Wait until the start has settled: /ping says 200 before CPU sharing dynamic's second
    llama-server has loaded (lifecycle.py), and a measurement taken while it loads pays for
    its load. Settled: it is healthy, not started (refused by the memory check, or failed),
    or none was planned."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            health = get_json(url + "/health")
        except urllib.error.HTTPError as err:  # 503 while a probe is missed: the same body
            health = json.loads(err.read())
        split = health.get("llama_server_split")
        if split is None or split["healthy"] or split["state"] == "not started":
            return
        time.sleep(0.2)
    raise RuntimeError(f"the second llama-server was not ready within {timeout} s")


def write(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
