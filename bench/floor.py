"""`floor`: a decision against the physical floor of its prompt.

The floor is llama-server's own prompt processing of the same text on the same machine (its
`/completion` timings, one token predicted, prompt cache off, always the same slot): a
decision cannot be cheaper than evaluating its prompt once. Reported per prompt length as
decision time / floor (goal <= 1.05x), for the engine's forward pass and for the whole HTTP
request.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.common import get_json, post

FILLER = (
    "Shipment {n} left the Leipzig warehouse on Monday, reached the regional hub on Wednesday "
    "and has shown no scan since; the customer asked twice and was promised a call back. "
)


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


def run(url: str, lengths: tuple[int, ...] = (200, 1000, 4000), repeats: int = 3) -> dict:
    clear_slots(url)
    rows: dict[str, Any] = {}
    for tokens in lengths:
        # A short prompt is cheap and its time moves most with this shared VM: more repeats.
        n = max(repeats, 2000 // tokens)
        forward, total, floor, prompt_tokens = [], [], [], []
        for r in range(n):
            # The decision first: its returned prompt is the floor's text. (Not alternated:
            # no way to render a decision's prompt without evaluating it.)
            reply = post(url + "/v1/decisions", floor_decision(tokens, tokens * 100 + r))
            assert reply.status == 200, reply.body
            result = reply.body["result"]
            forward.append(result["timing"]["forward_seconds"])
            total.append(reply.seconds)
            completion = post(
                url + "/completion",
                {
                    "prompt": result["prompt"],
                    "n_predict": 1,
                    "cache_prompt": False,
                    "temperature": 0,
                    # Always slot 0, the others left empty (clear_slots): no earlier floor
                    # prompt stays behind in another slot.
                    "id_slot": 0,
                },
            )
            assert completion.status == 200, completion.body
            timings = completion.body["timings"]
            floor.append(timings["prompt_ms"] / 1000)
            prompt_tokens.append(timings["prompt_n"])
        rows[str(tokens)] = {
            "repeats": n,
            "prompt_tokens": statistics.median(prompt_tokens),
            "decision_forward_seconds": statistics.median(forward),
            "decision_http_seconds": statistics.median(total),
            "floor_seconds": statistics.median(floor),
            "forward_over_floor": statistics.median(forward) / statistics.median(floor),
            "http_over_floor": statistics.median(total) / statistics.median(floor),
            # Each decision against the floor measured right after it: the machine's drift
            # over the run moves both alike.
            "forward_over_floor_paired_p50": statistics.median(
                f / fl for f, fl in zip(forward, floor, strict=True)
            ),
            "forward_seconds_all": forward,
            "floor_seconds_all": floor,
        }
    return {"lengths": rows, "target_ratio": 1.05}
