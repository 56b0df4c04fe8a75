"""`floor`: a decision against the physical floor of its prompt.

The floor is a stock llama-server's own prompt processing of the same text on the same machine
(its `/completion` timings, one token predicted, prompt cache off, one slot): a decision cannot
be cheaper than evaluating its prompt once. llama-server runs in both weight layouts
(`--repack`, llama.cpp's default, and `--no-repack`; bench/stock.py), each its own process,
measured in turn after every decision (the order alternating), and each row's floor is the
faster layout's (by median): the machine's best, whatever the proxy's own layout. Reported per
prompt length as decision time / floor (goal <= 1.05x), for the engine's forward pass and for
the whole HTTP request.

Against a running server (--endpoint: no model file to start llama-server from), the floor is
that server's own llama-server through its `/completion` instead, in whatever layout it runs.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from bench.common import get_json, post
from bench.stock import LAYOUTS, StockServer

FILLER = (
    "Shipment {n} left the Leipzig warehouse on Monday, reached the regional hub on Wednesday "
    "and has shown no scan since; the customer asked twice and was promised a call back. "
)
# The floor measured through the server's own llama-server (--endpoint runs).
OWN = "the server's own llama-server"


def floor_decision(tokens: int, n: int) -> dict[str, Any]:
    # About 32 tokens a sentence on the Qwen and SmolLM2 tokenizers; the prompt adds ~120.
    sentences = max(1, (tokens - 120) // 32)
    state = "".join(FILLER.format(n=f"{n}-{i}") for i in range(sentences))
    return {
        "decision": {
            "id": f"floor-{n}",
            "state": state,
            "question": "What should the agent do next?",
            "options": [
                {"id": "wait", "description": "Wait for the next scan"},
                {"id": "escalate", "description": "Escalate to the carrier"},
                {"id": "refund", "description": "Refund the customer"},
            ],
            "return_prompt": True,
        }
    }


def clear_slots(url: str) -> None:
    """Leaves one token in each of llama-server's slots: a slot keeps the prompt it last held
    in the unified KV cache, and cells left there by earlier suites (chat in generation, order)
    would lengthen every ubatch's attention in the floor measurement."""
    slots = get_json(url + "/props").get("total_slots", 1)
    for slot in range(slots):
        reply = post(
            url + "/completion",
            {"prompt": "x", "n_predict": 1, "cache_prompt": False, "id_slot": slot},
        )
        assert reply.status == 200, reply.body


def prompt_seconds(url: str, prompt: str) -> tuple[float, int]:
    """llama-server's own time for the prompt (its timings, not the HTTP round trip), and its
    token count."""
    completion = post(
        url + "/completion",
        {
            "prompt": prompt,
            "n_predict": 1,
            "cache_prompt": False,
            "temperature": 0,
            # Always slot 0, the others left empty (clear_slots): no earlier floor prompt
            # stays behind in another slot.
            "id_slot": 0,
        },
    )
    assert completion.status == 200, completion.body
    timings = completion.body["timings"]
    return timings["prompt_ms"] / 1000, int(timings["prompt_n"])


def run(
    url: str,
    lengths: tuple[int, ...] = (200, 1000, 4000),
    repeats: int = 3,
    model: Path | None = None,
) -> dict:
    """model: start a stock llama-server in each layout from it (the floor at the machine's
    best); None: the server's own llama-server, as it runs."""
    load = {"start": list(os.getloadavg())}
    if not model:
        clear_slots(url)
    stock = [StockServer(model, layout, ctx=8192) for layout in LAYOUTS] if model else []
    try:
        for server in stock:
            server.start()
        refs = {s.layout: s.url for s in stock} or {OWN: url}
        for ref in refs.values():
            # Untimed: each process's first prompt pays one-off costs (page faults, repacking
            # touched on first use), which would fall on one layout's first repeat.
            post(ref + "/completion", {"prompt": "warm up", "n_predict": 1, "cache_prompt": False})
        rows = {str(tokens): _row(url, refs, tokens, repeats) for tokens in lengths}
    finally:
        for server in stock:
            server.stop()
    load["end"] = list(os.getloadavg())
    return {
        "lengths": rows,
        # 1-minute, 5 and 15: above the cores' count, other work shared the machine.
        "load_average": load,
        "target_ratio": 1.05,
        "floor_reference": "stock llama-server, both layouts" if stock else OWN,
        "stock_servers": [s.describe() for s in stock],
    }


def _row(url: str, refs: dict[str, str], tokens: int, repeats: int) -> dict[str, Any]:
    # A short prompt is cheap and its time moves most with this shared VM: more repeats.
    n = max(repeats, 2000 // tokens)
    forward, total, prompt_tokens = [], [], []
    floors: dict[str, list[float]] = {name: [] for name in refs}
    for r in range(n):
        # The decision first: its returned prompt is the floor's text. (Not alternated: no way
        # to render a decision's prompt without evaluating it.)
        reply = post(url + "/v1/decisions", floor_decision(tokens, tokens * 100 + r))
        assert reply.status == 200, reply.body
        result = reply.body["result"]
        forward.append(result["timing"]["forward_seconds"])
        total.append(reply.seconds)
        # The layouts in turn, the order alternating: each is as often right after the
        # decision as the other.
        names = list(refs) if r % 2 == 0 else list(refs)[::-1]
        for name in names:
            seconds, count = prompt_seconds(refs[name], result["prompt"])
            floors[name].append(seconds)
        prompt_tokens.append(count)
    medians = {name: statistics.median(v) for name, v in floors.items()}
    best = min(medians, key=medians.__getitem__)
    floor = floors[best]
    return {
        "repeats": n,
        "prompt_tokens": statistics.median(prompt_tokens),
        "decision_forward_seconds": statistics.median(forward),
        "decision_http_seconds": statistics.median(total),
        # The faster layout's: the floor this row is measured against.
        "floor_layout": best,
        "floor_seconds": medians[best],
        "floor_seconds_by_layout": medians,
        "forward_over_floor": statistics.median(forward) / medians[best],
        "http_over_floor": statistics.median(total) / medians[best],
        # Each decision against the floor measured right after it: the machine's drift over
        # the run moves both alike.
        "forward_over_floor_paired_p50": statistics.median(
            f / fl for f, fl in zip(forward, floor, strict=True)
        ),
        "forward_seconds_all": forward,
        "http_seconds_all": total,
        "floor_seconds_all": floor,
        "floor_seconds_all_by_layout": floors,
    }
