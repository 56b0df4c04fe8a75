"""`state`: what the CPU path pays to keep a prefix between questions, in-process.

On a held ~4,000-token prefix: the time per question (suffix decode, then the prefix made whole
again for the next one), and the cost of moving the prefix's KV state between the engine and the
prefix cache (bytes, and milliseconds to save and to restore it).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from semif_proxy.engine import native

UNIT = (
    "Order 4471 was placed on the web shop, paid by card, packed in the Leipzig warehouse and "
    "handed to the carrier on Monday; tracking shows it in the regional hub since Wednesday. "
)


def run(model: Path, prefix_tokens: int = 4000, questions: int = 8, threads: int = 0) -> dict:
    core = native.Engine(str(model), n_ctx=8192, n_threads=threads, n_seq=8)
    text = UNIT * (prefix_tokens // 30 + 2)
    tokens = list(core.tokenize(text, add_special=True))
    prefix = tokens[: prefix_tokens - prefix_tokens % core.cell_align]
    suffixes = [
        list(core.tokenize(f" Question {i}: which team? Answer:")) for i in range(questions)
    ]
    ids = list(core.tokenize("ABCD", add_special=False))
    start = time.perf_counter()
    core.score(prefix, [[]], ids, "restore")
    prefill = time.perf_counter() - start
    per_question = []
    for s in suffixes:
        start = time.perf_counter()
        _, _, stats = core.score(prefix, [s], ids, "restore")
        assert stats["prefix_reused"] == len(prefix)
        per_question.append(time.perf_counter() - start)
    saves, restores = [], []
    state = b""
    logits = core.get_prefix_logits()
    for _ in range(5):
        start = time.perf_counter()
        state = core.get_prefix_state()
        saves.append(time.perf_counter() - start)
        start = time.perf_counter()
        core.set_prefix_state(state, prefix, logits)
        restores.append(time.perf_counter() - start)
    out: dict[str, Any] = {
        "model": model.name,
        "prefix_tokens": len(prefix),
        "threads": core.n_threads,
        "prefill_seconds": prefill,
        "question_seconds": {"median": statistics.median(per_question), "all": per_question},
        "state_bytes": len(state),
        "save_ms": 1000 * statistics.median(saves),
        "restore_ms": 1000 * statistics.median(restores),
    }
    return out
