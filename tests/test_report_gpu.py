"""docs/benchmarks.md's GPU section from a GPU results file: the device named, medians with an
interval only where there are enough requests, the AWS sample's figures beside ours with the
difference said, agreement and memory rows, and a failed section named instead of dropped."""

from __future__ import annotations

from pathlib import Path

from bench import report_gpu

STATS = {"n": 2, "p50": 0.02, "p95": 0.03, "max": 0.03, "mean": 0.02}


def result() -> dict:
    many = [0.010 + 0.001 * i for i in range(21)]  # median 0.020
    return {
        "gpu": [["NVIDIA H200", "143771", "580.159.04"]],
        "machine": {"cores": 16, "date": "2026-12-04T17:00Z"},
        "latency": {
            "200": {
                "input_tokens": {**STATS, "p50": 203},
                "client_seconds": {**STATS, "n": 21, "p95": 0.029},
                "forward_seconds": {**STATS, "p50": 0.004},
                "client_values": many,
            },
            "4000": {
                "input_tokens": {**STATS, "p50": 3990},
                "client_seconds": STATS,
                "forward_seconds": STATS,
                "client_values": [0.05, 0.06],
            },
        },
        "jevbench": {"tasks": 21, "client_seconds": STATS, "client_values": many},
        "throughput": {
            "1": {"decisions_per_second": 40.0, "seconds": 5.0, "latency": STATS},
        },
        "agreement": {
            "model": "model.gguf",
            "prompts": 13,
            "max_abs_dp": 1.2e-4,
            "max_abs_dlogit": 3e-3,
            "argmax_agreement": 1.0,
            "jevbench": {"tasks": 48, "max_abs_dp": 2e-4, "argmax_flips": ["easy-a", "easy-b"]},
        },
        "memory": {"error": "RuntimeError('no nvidia-smi')"},
    }


def test_gpu_section_from_a_results_file() -> None:
    used = []

    def get(name: str) -> dict:
        used.append(name)
        return result()

    lines = report_gpu.section([Path("gpu-h200.json")], get, lambda: "Data: gpu-h200.json.")
    text = "\n".join(lines)
    assert used == ["gpu-h200.json"]
    assert "**NVIDIA H200, 143771 MiB, driver 580.159.04** (16 host cores)" in text
    # 21 requests: the median 20.0 ms with an interval inside the values' range.
    row = next(line for line in lines if line.startswith("| 203 |"))
    point, interval = row.split("|")[3].strip().split(" ms ")
    lo, hi = (float(x) for x in interval.strip("[]").split(", "))
    assert point == "20.0" and 10.0 <= lo <= 20.0 <= hi <= 30.0
    # Two requests: too few for an interval, and it says so.
    assert "| 3990 | 2 | 55.0 ms (no interval: 2 requests) |" in text
    assert (
        "| AWS SemIf sample (its README) | L40S-class (g6e) | its own | JevBench | 352 ms | "
        in text
    )
    assert "**Different model and hardware**" in text
    assert "| model.gguf | 13 | 1.2e-04 | 3.0e-03 | 100% | 48 | 2.0e-04 | 2 |" in text
    assert "Not measured in this run: memory (RuntimeError('no nvidia-smi'))." in text
    assert "Data: gpu-h200.json." in text


def test_no_gpu_results_says_so() -> None:
    lines = report_gpu.section([], lambda name: None, lambda: "")
    assert lines[0] == "## GPU" and "No GPU results yet" in lines[2]


def test_the_checks_own_findings_come_first() -> None:
    data = {
        "gpu": [["NVIDIA H200", "143771", "580.159.04"]],
        "check": {
            "model": {"params": 296268800, "dtype": "f16"},
            "exactness": [
                {
                    "model": "model-q4_k_m.gguf",
                    "gpu_layers": 999,
                    "check": {"passed": True, "max_abs_difference": 2.5e-4, "tolerance": 0.001},
                }
            ],
            "tests": {"tests": 10, "failures": 2, "errors": 1, "skipped": 1, "time": 99.6},
            "timed_out": True,
            "serial_run": False,
            "failed_steps": "tests bench",
            "self_check_refusals": [
                {"max_abs_difference": 0.00635, "tolerance": 0.001},
                {"max_abs_difference": 0.0178, "tolerance": 0.001},
            ],
            "tolerance_exceeded": [0.0045, 0.0213],
        },
        "latency": {"error": "not run: the server refused decisions (exactness self-check)"},
    }
    text = "\n".join(report_gpu.section([Path("gpu-h200.json")], lambda n: data, lambda: ""))
    assert (
        "| `not slow` suite, full offload, generated F16 model | 6 passed, 2 failed, 1 errors, "
        "1 skipped in 100 s; cut at its time budget; the `serial` tests not reached |"
    ) in text
    refused = "failed: 0.00635 to 0.0178 against 0.001 allowed, so the engine refused decisions"
    assert f"**{refused}**" in text
    assert "exceeded in 2 comparisons, by 0.0045 to 0.0213 |" in text
    assert "Not measured in this run: latency (not run: the server refused decisions" in text
    assert text.index("exactness self-check") < text.index("Not measured")
    assert "on a generated 296M-parameter llama in f16 with random weights" in text
    assert (
        "| exactness self-check at start, model-q4_k_m.gguf, 999 layers offloaded | passed; "
        "largest letter-logit difference 0.00025 (allowed 0.001) |"
    ) in text
    # Nothing was timed: no word about intervals, and no Q4_K_M agreement claimed.
    assert "bootstrap" not in text and "Q4_K_M quantization" not in text


def test_a_run_without_figures_to_compare_shows_dashes() -> None:
    """A quantized server that answered while the F16 one refused: no prompt compared on the
    first model gives None figures, shown as dashes instead of a crash."""
    data = {
        "agreement": {"model": "m.gguf", "prompts": 0, "max_abs_dp": None,
                      "max_abs_dlogit": None, "argmax_agreement": None},
        "shared": {"questions": 21, "speedup": None},
        "throughput": {},
    }  # fmt: skip
    text = "\n".join(report_gpu.section([Path("gpu-x.json")], lambda n: data, lambda: ""))
    assert "| m.gguf | 0 | — | — | — | — | — | — |" in text
    assert "Shared state" not in text and "concurrent clients" not in text
