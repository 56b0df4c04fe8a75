"""`split`: what splitting a decision at its state costs, in-process, on the floor's prompts.

A decision's prompt is split at its state's aligned prefix, so that a question gets the same
numbers alone, next to others on one state, or after a prefix the server still holds. On the
CPU a fresh prefix is decoded in the same calls as its first question (Engine::ensure_prefix),
so a single decision costs what one call of the whole prompt costs; a question on a prefix
evaluated apart costs two calls or more. This suite times all three on the same prompts in one
engine, each on a fresh state: the decision as served (`evaluate()`), the prefix alone then the
question (`two_calls`), and `score()` of the whole prompt (`one_call`), apart from HTTP,
llama-server and the CPU sharing. The engine runs with the threads a decision gets by default.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.common import summary
from bench.floor import floor_decision
from semif_proxy.engine.questions import Question
from semif_proxy.engine.worker import DecisionEngine
from semif_proxy.settings import load_settings


def run(model: Path, lengths: tuple[int, ...] = (200, 1000), repeats: int = 8) -> dict[str, Any]:
    settings = load_settings({"SEMIF_CHAT": "off", "SEMIF_PREFIX_CACHE_MB": "0"}, model=str(model))
    engine = DecisionEngine.load(settings)
    rows: dict[str, Any] = {}
    try:
        for tokens in lengths:
            split, prefix, suffix, whole, apart, shapes = [], [], [], [], [], set()
            for r in range(repeats):
                d = floor_decision(tokens, 7000 + tokens * 10 + r)["decision"]
                question = Question(
                    path="decision",
                    id=d["id"],
                    state=d["state"],
                    question=d["question"],
                    descriptions=tuple(o["description"] for o in d["options"]),
                )
                engine.core.reset()
                evaluation = engine.evaluate([question])
                timing = evaluation.timing
                split.append(timing["forward_seconds"])
                prefix.append(timing["prefill_seconds"])
                suffix.append(timing["suffix_seconds"])
                shapes.add((timing["prefix_tokens"], timing["suffix_tokens"]))
                full = engine.tokenize_prompt(evaluation.scored[0].prompt)

                def one_call(full: list[int] = full) -> float:
                    engine.core.reset()
                    start = time.perf_counter()
                    engine.core.score(full, [[]], engine.letter_ids)
                    return time.perf_counter() - start

                def two_calls(full: list[int] = full, cut: int = timing["prefix_tokens"]) -> float:
                    engine.core.reset()
                    start = time.perf_counter()
                    engine.core.score(full[:cut], [[]], engine.letter_ids)
                    engine.core.score(full[:cut], [full[cut:]], engine.letter_ids, "restore")
                    return time.perf_counter() - start

                # On the engine's own thread, as evaluate() runs: a second thread computing
                # here would start a second OpenMP pool and slow both (engine_thread.py).
                whole.append(engine.thread.call(one_call))
                apart.append(engine.thread.call(two_calls))
            rows[str(tokens)] = {
                "prompt_tokens": len(full),
                "prefix_and_question_tokens": sorted(shapes),
                "split_seconds": summary(split),
                "prefix_seconds": summary(prefix),
                "question_seconds": summary(suffix),
                "one_call_seconds": summary(whole),
                "two_calls_seconds": summary(apart),
                "split_over_one_call": summary(split)["p50"] / summary(whole)["p50"],
                "two_calls_over_one_call": summary(apart)["p50"] / summary(whole)["p50"],
            }
    finally:
        engine.close()
    return {"lengths": rows, "engine_threads": engine.core.n_threads}


def headline(r: dict[str, Any]) -> str:
    return "; ".join(
        f"{row['prompt_tokens']} tokens: decision {row['split_seconds']['p50']:.3f} s, prefix "
        f"apart {row['two_calls_seconds']['p50']:.3f} s, one call "
        f"{row['one_call_seconds']['p50']:.3f} s ({row['split_over_one_call']:.3f}x, "
        f"{row['two_calls_over_one_call']:.3f}x)"
        for row in r["lengths"].values()
    )
