"""The GPU benchmark's code path (bench/gpu.py), run here on the CPU as the GPU check's dry run
runs it: its JevBench section asks System One questions from a task file, its agreement section
compares two servers' answers per task and per prompt (the README's routing example first), and
a second model gets the same comparison. Two CPU servers with the same settings compute the same
bits, so every difference here must be exactly zero; the comparison itself is checked on
hand-made answers."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from bench import gpu
from semif_proxy.eval.jevbench import Task

CHOICE = {
    "id": "t-choice",
    "expected": "refund",
    "labels": ["refund", "shipping"],
    "state": "I was charged twice for my order and want my money back.",
    "question": {
        "type": "choice",
        "instructions": "What does the customer want?",
        "criteria": {"refund": "Money back for a charge", "shipping": "Where the parcel is"},
    },
}
NOUL = {
    "id": "t-noul",
    "expected": "yes",
    "labels": ["no", "yes"],
    "state": "Order #12. Status: shipped on 3 May.",
    "question": {
        "type": "noul",
        "instructions": "Has the order been shipped?",
        "criteria": {"true": "The text states that it was", "false": "It was not"},
    },
}


def test_compare_tasks_reports_the_largest_difference_and_the_flips() -> None:
    tasks = [Task("easy", {**CHOICE, "id": "a"}), Task("easy", {**NOUL, "id": "b"})]
    gpu_side = [
        {"type": "choice", "probabilities": {"refund": 0.70, "shipping": 0.30}},
        {"type": "noul", "noul": 0.52},
    ]
    cpu_side = [
        {"type": "choice", "probabilities": {"refund": 0.68, "shipping": 0.32}},
        {"type": "noul", "noul": 0.47},
    ]
    got = gpu.compare_tasks(tasks, gpu_side, cpu_side)
    # a: |0.70 - 0.68| = 0.02 on both labels, same argmax; b: yes 0.52 vs 0.47 flips the answer.
    assert got["per_task_dp"] == pytest.approx({"a": 0.02, "b": 0.05})
    assert got["max_abs_dp"] == pytest.approx(0.05)
    assert got["argmax_flips"] == ["b"]


def test_a_missing_task_file_is_a_usage_error(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        gpu.main(["--model", str(tmp_path / "m.gguf"), "--out", str(tmp_path / "o.json"),
                  "--jevbench", str(tmp_path / "none.jsonl")])  # fmt: skip
    assert exited.value.code == 2
    assert "--jevbench: no such file" in capsys.readouterr().err


@pytest.mark.skipif(
    os.environ.get("SEMIF_TEST_GPU_LAYERS", "0") not in ("", "0"),
    reason="two CPU servers compute the same bits; on a GPU host ggml may offload large matrix "
    "products of the 'GPU' side even at 0 layers (bench/gpu.py's own run is the check there)",
)
@pytest.mark.serial  # its servers take every core (SEMIF_THREADS = the machine's)
@pytest.mark.timeout(600)  # four server starts
def test_agreement_and_jevbench_sections_on_two_cpu_servers(
    model_path: Path, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in (CHOICE, NOUL)))
    second = tmp_path / "second.gguf"  # the same weights under another name: a second model
    shutil.copyfile(model_path, second)
    out = tmp_path / "gpu.json"
    argv = ["--model", str(model_path), "--out", str(out), "--quick", "--gpu-layers", "0"]
    argv += ["--skip", "latency,shared,throughput,memory", "--jevbench", str(tasks)]
    argv += ["--quantized", str(second), "--logs", str(tmp_path), "--agreement-prompts", "1"]
    assert gpu.main(argv) == 0
    result = json.loads(out.read_text())

    assert result["jevbench"]["tasks"] == 2
    assert result["jevbench"]["client_seconds"]["n"] == 2
    assert result["jevbench"]["client_seconds"]["p50"] > 0
    for key, name in (("agreement", model_path.name), ("quantized", "second.gguf")):
        section = result[key]
        assert "error" not in section, section
        assert section["model"] == name
        assert section["prompts"] == 2  # the routing example and one sized ticket text
        assert section["max_abs_dp"] == 0.0 and section["max_abs_dlogit"] == 0.0
        assert section["argmax_agreement"] == 1.0
        assert section["jevbench"]["tasks"] == 2
        assert section["jevbench"]["max_abs_dp"] == 0.0
        assert section["jevbench"]["argmax_flips"] == []
    # The README's routing example went first, a three-option decision; the ticket text after
    # it has 2 + 0 % 3 options (agreement_prompts).
    assert result["agreement"]["options"] == [3, 2]
    assert (tmp_path / "cpu-second.log").is_file() and (tmp_path / "quantized.log").is_file()


def test_a_server_that_refuses_decisions_fails_its_start_at_once(
    tiny_merging_model: Path, start_proxy
) -> None:
    """The helper the benchmarks start servers with stops waiting as soon as /ping says the
    engine refuses the model, and says why (on the GPU host an engine whose self-check failed
    otherwise held the whole bench budget in a wait for a readiness that never came)."""
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"refuses decisions: .*does not tokenize"):
        start_proxy(tiny_merging_model, preset="decisions", timeout=300)
    assert time.monotonic() - started < 60
