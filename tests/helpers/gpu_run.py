"""What the GPU check (scripts/gpu_check.sh) changes in the suite, by environment variable.

The GPU host cannot fetch SmolLM2 (no network; 98 MB is over what a run may carry), so the
suite runs there on a generated random-weight model (`python -m semif_proxy.model.tiny_gguf`):
- SEMIF_TEST_GENERATED_MODEL=1: tests that assert SmolLM2's own numbers (its sha256, its
  vocabulary size) are skipped, with the reason, and so are the few whose premise is this
  machine's Python rather than the GPU's (GPU_HOST);
- SEMIF_TEST_GPU_LAYERS other than 0: tests whose premise is a CPU-speed prefill (a 3,800-token
  prompt that takes ~15 s, so that a 3 s deadline or a hang-up after 1 s lands in the middle of
  it) are marked xfail (not strict: they still run, and an XPASS is reported as such). On a GPU
  that prefill takes milliseconds; the abort path itself is CPU-only in llama.cpp (the abort
  callback is checked by the CPU backend between graph nodes).

Entries are matched on the test's node id without its parameters. One that matches nothing is
reported on stderr at collection, so a renamed test is noticed instead of silently running.

SEMIF_TEST_FIRST (space-separated test files) runs those files first, in that order, each
file's tests in their own order: a run cut short by its time budget has run what matters most.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableSequence

import pytest

SMOLLM2_ONLY = {
    "tests/test_native.py::test_model_metadata": "asserts SmolLM2's vocabulary (49152 tokens)",
    "tests/test_server.py::test_ping_and_health": "asserts SmolLM2's sha256 (b179c952...)",
    "tests/test_engine.py::test_probabilities_are_a_distribution_in_request_order": (
        "asserts SmolLM2's sha256 (b179c952...)"
    ),
}

# Not about the model or the GPU: what the GPU host's own Python makes differ.
GPU_HOST = {
    "tests/test_settings.py::test_the_largest_choice_the_api_accepts_fits_the_default_context": (
        "sizes the largest choice with SmolLM2's tokenizer (8,693 tokens with the generated "
        "model's, over its 8,192 context)"
    ),
    "tests/test_bench_readouts.py::test_readouts_page_is_current": (
        "compares a page generated with constraints.txt's numpy; the GPU image's numpy rounds "
        "one interval differently"
    ),
}

CPU_SPEED = {
    "tests/test_sagemaker.py::test_deadline_stops_the_work_and_says_why": (
        "needs a prefill longer than a 3 s deadline (a 3,800-token prompt: ~15 s on a CPU)"
    ),
    "tests/test_sagemaker.py::test_a_client_that_hangs_up_stops_its_prefill": (
        "needs a prefill still running 1 s after the request (CPU speed)"
    ),
    "tests/test_robustness.py::test_slow_decision_times_out_with_504": (
        "needs a prefill longer than 10 ms (a 4,500-character state)"
    ),
    "tests/test_native.py::test_decode_releases_the_gil": (
        "counts 1 ms ticks during one decode, which takes under 5 ms on a GPU"
    ),
    "tests/test_cpu_dynamic.py::test_the_thread_count_changes_between_ubatches_and_no_bit_moves": (
        "preempts a ubatch through the abort callback, which only the CPU backend checks"
    ),
    "tests/test_cpu_dynamic.py::test_a_preempted_batch_of_option_suffixes_gives_the_same_bits": (
        "preempts a ubatch through the abort callback, which only the CPU backend checks"
    ),
    "tests/test_cpu_dynamic.py::test_a_preempted_label_tree_gives_the_same_bits": (
        "preempts a ubatch through the abort callback, which only the CPU backend checks"
    ),
    "tests/test_cpu_dynamic.py::"
    "test_a_preempted_prefix_and_question_in_one_ubatch_give_the_same_bits": (
        "preempts a ubatch through the abort callback, which only the CPU backend checks"
    ),
    "tests/test_engine_thread.py::test_a_served_decision_does_not_sleep_at_ggml_barriers": (
        "counts sleeps at ggml's CPU barriers; with the layers offloaded the threads wait on "
        "the GPU"
    ),
}


def _active() -> list[tuple[dict[str, str], str, str]]:
    """(table, how, what the reason starts with) for the tables this run applies."""
    out: list[tuple[dict[str, str], str, str]] = []
    if os.environ.get("SEMIF_TEST_GENERATED_MODEL", "") not in ("", "0"):
        out.append((SMOLLM2_ONLY, "skip", "generated model"))
        out.append((GPU_HOST, "skip", "GPU host"))
    if os.environ.get("SEMIF_TEST_GPU_LAYERS", "0") not in ("", "0"):
        out.append((CPU_SPEED, "xfail", "GPU offload"))
    return out


def reorder(items: MutableSequence[pytest.Item]) -> None:
    """SEMIF_TEST_FIRST's files first (a stable sort: every file keeps its tests' order)."""
    first = os.environ.get("SEMIF_TEST_FIRST", "").split()
    if not first:
        return
    rank = {path: i for i, path in enumerate(first)}
    items[:] = sorted(items, key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(first)))


def adjust(items: MutableSequence[pytest.Item]) -> None:
    """Skip or xfail the listed tests, then order them (the pytest_collection_modifyitems hook
    calls this)."""
    reorder(items)
    active = _active()
    if not active:
        return
    seen: set[str] = set()
    for item in items:
        base = item.nodeid.split("[", 1)[0]
        for table, how, label in active:
            reason = table.get(base)
            if reason is None:
                continue
            seen.add(base)
            if how == "skip":
                item.add_marker(pytest.mark.skip(reason=f"{label}: {reason}"))
            else:
                item.add_marker(pytest.mark.xfail(reason=f"{label}: {reason}", strict=False))
    for table, _, _ in active:
        for nodeid in sorted(set(table) - seen):
            sys.stderr.write(f"gpu_run: {nodeid} is listed but was not collected\n")
