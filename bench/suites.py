"""The benchmarks. Each compares paths side by side in one run against one server and returns
a JSON-able dict; bench/run.py writes it to bench/results/."""

from __future__ import annotations

import concurrent.futures
import json
import math
import time
from pathlib import Path
from typing import Any

from bench.common import get_json, memory_kb, post, progress, summary
from semif_proxy.calibration.temperature import ece
from semif_proxy.engine.examples import ROUTING_OPTIONS, ROUTING_STATE
from semif_proxy.engine.prompt import LETTERS
from semif_proxy.eval.jevbench import (
    Task,
    label_probabilities,
    predicted_label,
    read_tasks,
    task_files,
)
from semif_proxy.testing.server import ProxyProcess

LONG_STATE_UNIT = (
    "Order 4471 was placed on the web shop, paid by card, packed in the Leipzig warehouse and "
    "handed to the carrier on Monday; tracking shows it in the regional hub since Wednesday. "
)


def tasks(limit: int | None, only: str | None, files: list[Path] | None = None) -> list[Task]:
    chosen = list(read_tasks(files or task_files()))
    if only:
        wanted = set(only.split(","))
        chosen = [t for t in chosen if t.file in wanted or t.id in wanted]
    return chosen[:limit] if limit else chosen


# -- 1. JevBench ------------------------------------------------------------------------------


def jevbench(
    server: ProxyProcess, limit: int | None, only: str | None, via_invocations: bool
) -> dict[str, Any]:
    chosen = tasks(limit, only)
    rows = []
    for i, task in enumerate(chosen):
        path = "/invocations" if via_invocations else "/v1/systemone"
        reply = post(server.url + path, task.request())
        row: dict[str, Any] = {
            "id": task.id,
            "file": task.file,
            "type": task.kind,
            "expected": task.expected,
            "status": reply.status,
            "seconds": reply.seconds,
        }
        if reply.status == 200:
            answer = reply.body["answers"]["q"]
            probs = label_probabilities(answer)
            predicted = predicted_label(answer)
            diag = reply.body.get("semif", {}).get("questions", {}).get("q", {})
            row.update(
                predicted=predicted,
                correct=predicted == task.expected,
                confidence=max(probs.values()),
                probabilities=probs,
                prompt_tokens=reply.body["usage"]["input_tokens"],
                # What `semif-proxy calibrate --predictions` reads.
                option_logits=(diag.get("option_logits") or [None])[0],
                option_ids=(
                    ["yes", "no"] if task.kind == "noul" else list(answer["probabilities"])
                ),
            )
        rows.append(row)
        progress(i + 1, len(chosen), "jevbench")
    ok = [r for r in rows if r["status"] == 200]
    per_file = {}
    for name in sorted({r["file"] for r in rows}):
        group = [r for r in ok if r["file"] == name]
        per_file[name] = {
            "tasks": len([r for r in rows if r["file"] == name]),
            "correct": sum(r["correct"] for r in group),
        }
    return {
        "route": "/invocations" if via_invocations else "/v1/systemone",
        "tasks": len(rows),
        "answered": len(ok),
        "correct": sum(r["correct"] for r in ok),
        "accuracy": sum(r["correct"] for r in ok) / max(len(rows), 1),
        "per_file": per_file,
        "latency_seconds": summary([r["seconds"] for r in ok]),
        "prompt_tokens": summary([float(r["prompt_tokens"]) for r in ok]),
        "ece": ece([r["confidence"] for r in ok], [r["correct"] for r in ok]),
        "rows": rows,
    }


def plots(result: dict[str, Any], out: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    ok = [r for r in result["rows"] if r["status"] == 200]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.hist([r["seconds"] * 1000 for r in ok], bins=30)
    a.set_xlabel("latency (ms)")
    a.set_ylabel("tasks")
    a.set_title("JevBench latency")
    bins = [[] for _ in range(10)]
    for r in ok:
        bins[min(int(r["confidence"] * 10), 9)].append(r)
    xs = [sum(x["confidence"] for x in g) / len(g) for g in bins if g]
    ys = [sum(x["correct"] for x in g) / len(g) for g in bins if g]
    b.plot([0, 1], [0, 1], "--", color="grey")
    b.plot(xs, ys, "o-")
    b.set_xlabel("confidence (argmax probability)")
    b.set_ylabel("accuracy")
    b.set_title(f"Reliability (ECE {result['ece']:.3f})")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


# -- 2. Decision vs generation ------------------------------------------------------------------


def _choice_decision(task: Task) -> dict[str, Any]:
    q = task.row["question"]
    if q["type"] == "noul":
        options = [{"id": "yes", "description": "yes"}, {"id": "no", "description": "no"}]
    elif q["type"] == "score":
        options = [{"id": str(i), "description": str(c)} for i, c in enumerate(q["criteria"])]
    else:
        options = [
            {"id": k, "description": f"{k}: {v or ''}".rstrip(": ")}
            for k, v in q["criteria"].items()
        ]
    state = task.row["state"]
    return {
        "id": task.id,
        "state": state,
        "question": str(q.get("instructions") or "Which option fits?"),
        "options": options,
        "return_prompt": True,
    }


def _ask_chat(server: ProxyProcess, decision: dict[str, Any]) -> tuple[Any, str, str | None]:
    """The decision asked as a chat completion (option ids listed in the decision's order,
    greedy); returns the call, the reply and the option id the reply names first."""
    listing = "\n".join(f"- {o['id']}: {o['description']}" for o in decision["options"])
    body = {
        "messages": [
            {
                "role": "user",
                "content": (
                    f"Evidence: {json.dumps(decision['state'], ensure_ascii=False)}\n"
                    f"Question: {decision['question']}\nOptions:\n{listing}\n"
                    "Answer with the option id only."
                ),
            }
        ],
        "temperature": 0,
        "max_tokens": 16,
    }
    chat = post(server.url + "/v1/chat/completions", body)
    text = chat.body["choices"][0]["message"]["content"].strip() if chat.status == 200 else ""
    ids = [o["id"] for o in decision["options"]]
    at = {o: text.lower().find(o.lower()) for o in ids}
    named = [o for o in ids if at[o] >= 0]
    return chat, text, (min(named, key=lambda o: (at[o], -len(o))) if named else None)


def generation(
    server: ProxyProcess, limit: int | None, only: str | None, n_probs: int
) -> dict[str, Any]:
    chosen = tasks(limit, only)
    rows = []
    for i, task in enumerate(chosen):
        decision = _choice_decision(task)
        ours = post(server.url + "/v1/decisions", {"decision": decision})
        if ours.status != 200:
            continue
        result = ours.body["result"]
        ids = result["option_ids"]
        best = ids[max(range(len(ids)), key=lambda j: result["probabilities"][j])]
        # (a) Chat completion asked for the option id, greedy.
        chat, text, chat_id = _ask_chat(server, decision)
        # (b) llama-server /completion on our exact prompt: one token, top-n log-probs.
        comp = post(
            server.url + "/completion",
            {
                "prompt": result["prompt"],
                "n_predict": 1,
                "n_probs": n_probs,
                "temperature": 0,
                "cache_prompt": False,
            },
        )
        top = comp.body["completion_probabilities"][0]["top_logprobs"] if comp.status == 200 else []
        letters = {t["token"]: t["logprob"] for t in top}
        wanted = [LETTERS[j] for j in range(len(ids))]
        found = {L: letters[L] for L in wanted if L in letters}
        http_best = ids[wanted.index(max(found, key=found.get))] if found else None
        # Same prompt, same model: when every letter is in llama-server's top-n, its letter
        # distribution should be ours.
        gap = None
        if len(found) == len(wanted):
            theirs = [math.exp(found[L]) for L in wanted]
            gap = max(abs(t / sum(theirs) - p) for t, p in zip(theirs, result["probabilities"]))
        rows.append(
            {
                "id": task.id,
                "options": len(ids),
                "decision_seconds": ours.seconds,
                "chat_seconds": chat.seconds,
                "completion_seconds": comp.seconds,
                "decision_argmax": best,
                "chat_answer": text[:40],
                "chat_argmax": chat_id,
                "completion_argmax": http_best,
                "letters_missing": len(wanted) - len(found),
                "probability_gap_vs_completion": gap,
            }
        )
        progress(i + 1, len(chosen), "generation")
    d = [r["decision_seconds"] for r in rows]
    c = [r["chat_seconds"] for r in rows]
    h = [r["completion_seconds"] for r in rows]
    return {
        "tasks": len(rows),
        "n_probs": n_probs,
        "decision_seconds": summary(d),
        "chat_seconds": summary(c),
        "completion_seconds": summary(h),
        "chat_over_decision_p50": summary(c)["p50"] / summary(d)["p50"],
        "completion_over_decision_p50": summary(h)["p50"] / summary(d)["p50"],
        "chat_argmax_agreement": sum(r["chat_argmax"] == r["decision_argmax"] for r in rows)
        / max(len(rows), 1),
        "chat_unparseable": sum(r["chat_argmax"] is None for r in rows) / max(len(rows), 1),
        "completion_argmax_agreement": sum(
            r["completion_argmax"] == r["decision_argmax"] for r in rows
        )
        / max(len(rows), 1),
        "completion_missing_some_letter": sum(r["letters_missing"] > 0 for r in rows)
        / max(len(rows), 1),
        "probability_gap_vs_completion_max": max(
            (r["probability_gap_vs_completion"] for r in rows if r["letters_missing"] == 0),
            default=None,
        ),
        "rows": rows,
    }


# -- 3. Overhead --------------------------------------------------------------------------------


def overhead(server: ProxyProcess, repeats: int) -> dict[str, Any]:
    decision = {
        "id": "o",
        "state": LONG_STATE_UNIT * 2,
        "question": "Where is the parcel?",
        "options": [
            {"id": "hub", "description": "at the regional hub"},
            {"id": "home", "description": "delivered"},
            {"id": "lost", "description": "lost"},
        ],
    }
    http, forward = [], []
    for i in range(repeats):
        # A different question each time: no exact reuse, the suffix is decoded every time.
        body = {"decision": dict(decision, question=f"Where is the parcel? (check {i})")}
        reply = post(server.url + "/v1/decisions", body)
        http.append(reply.seconds)
        forward.append(reply.body["result"]["timing"]["forward_seconds"])
        progress(i + 1, repeats, "overhead")
    ratios = [h / f for h, f in zip(http, forward)]
    return {
        "http_seconds": summary(http),
        "forward_seconds": summary(forward),
        "ratio_p50": summary(http)["p50"] / summary(forward)["p50"],
        "ratio_per_request": summary(ratios),
        "target_ratio_p50": 1.10,
    }


# -- 4. Shared state ------------------------------------------------------------------------------


def shared(
    server: ProxyProcess, questions: int, rounds: int, state_units: int = 15
) -> dict[str, Any]:
    """21 questions on one state three ways: one shared request; 21 single requests on the same
    state (the server keeps the prefix between them, so only the first pays the prefill); and
    21 single requests that each pay the prefill (what a server without prefix reuse does)."""
    options = [
        {"id": f"o{i}", "description": d}
        for i, d in enumerate(
            ["billing", "account access", "shipping", "returns", "product question"]
        )
    ]

    def asks(state: str) -> list[dict[str, Any]]:
        return [
            {
                "id": f"q{i}",
                "state": state,
                "question": f"Question {i}: which team should act?",
                "options": options,
            }
            for i in range(questions)
        ]

    warm_s, cold_s, shared_s = [], [], []
    tokens = 0
    for r in range(rounds):
        start = time.perf_counter()
        for d in asks(f"Ticket {r}a: " + LONG_STATE_UNIT * state_units):
            assert post(server.url + "/v1/decisions", {"decision": d}).status == 200
        warm_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        for i, d in enumerate(asks(f"Ticket {r}c: " + LONG_STATE_UNIT * state_units)):
            # A different first word per question defeats every kind of prefix reuse.
            d = dict(d, state=f"({i}) " + d["state"])
            assert post(server.url + "/v1/decisions", {"decision": d}).status == 200
        cold_s.append(time.perf_counter() - start)
        reply = post(
            server.url + "/v1/decisions",
            {"decisions": asks(f"Ticket {r}s: " + LONG_STATE_UNIT * state_units)},
        )
        assert reply.status == 200, reply.body
        shared_s.append(reply.seconds)
        tokens = reply.body["results"][0]["input_tokens"]
        progress(r + 1, rounds, "shared")
    rate = {
        k: questions / summary(v)["p50"]
        for k, v in (
            ("shared", shared_s),
            ("singles_reusing_prefix", warm_s),
            ("singles_cold", cold_s),
        )
    }
    return {
        "questions": questions,
        "prompt_tokens_per_question": tokens,
        "shared_seconds": summary(shared_s),
        "singles_reusing_prefix_seconds": summary(warm_s),
        "singles_cold_seconds": summary(cold_s),
        "decisions_per_s": rate,
        "speedup_vs_cold_singles": rate["shared"] / rate["singles_cold"],
        "speedup_vs_reusing_singles": rate["shared"] / rate["singles_reusing_prefix"],
        "target_speedup": 4.0,
    }


# -- 5. Prefix cache ------------------------------------------------------------------------------


def prefix_cache(server: ProxyProcess, state_tokens: int, rounds: int) -> dict[str, Any]:
    options = [{"id": "a", "description": "yes"}, {"id": "b", "description": "no"}]
    unit_tokens = 40  # about, for SmolLM2/Qwen tokenizers
    units = max(1, state_tokens // unit_tokens)
    cold, warm = [], []
    tokens = 0
    for r in range(rounds):
        state = f"Case {r}. " + LONG_STATE_UNIT * units
        other = f"Other case {r}. " + LONG_STATE_UNIT * units
        first = post(
            server.url + "/v1/decisions",
            {
                "decision": {
                    "id": "c",
                    "state": state,
                    "question": "Was it shipped?",
                    "options": options,
                }
            },
        )
        cold.append(first.seconds)
        # Another state in between, so the engine no longer holds this one in sequence 0.
        post(
            server.url + "/v1/decisions",
            {
                "decision": {
                    "id": "x",
                    "state": other,
                    "question": "Was it shipped?",
                    "options": options,
                }
            },
        )
        second = post(
            server.url + "/v1/decisions",
            {
                "decision": {
                    "id": "w",
                    "state": state,
                    "question": "Is it late?",
                    "options": options,
                }
            },
        )
        warm.append(second.seconds)
        tokens = first.body["result"]["input_tokens"]
        progress(r + 1, rounds, "prefix")
    health = get_json(server.url + "/health")
    hits = health["prefix_cache"]["hits"]
    return {
        "state_tokens": tokens,
        "cold_seconds": summary(cold),
        "warm_seconds": summary(warm),
        "warm_over_cold_p50": summary(warm)["p50"] / summary(cold)["p50"],
        "cache_hits": hits,
        "target_ratio": 0.3,
    }


# -- 6. Scaling -----------------------------------------------------------------------------------


def scaling(
    server: ProxyProcess,
    lengths: list[int],
    option_counts: list[int],
    clients: list[int],
    per_client: int,
) -> dict[str, Any]:
    by_length = {}
    for n in lengths:
        # Its own opening, so that nothing held or cached from an earlier suite or row (each
        # longer state would otherwise extend the shorter one) makes the row less than cold.
        state = f"Scaling case {n}. " + LONG_STATE_UNIT * max(1, n // 40)
        reply = post(
            server.url + "/v1/decisions",
            {
                "decision": {
                    "id": "l",
                    "state": state,
                    "question": "Was it shipped?",
                    "options": [
                        {"id": "a", "description": "yes"},
                        {"id": "b", "description": "no"},
                    ],
                }
            },
        )
        by_length[n] = {"tokens": reply.body["result"]["input_tokens"], "seconds": reply.seconds}
        progress(len(by_length), len(lengths), "length")
    by_options = {}
    base_state = LONG_STATE_UNIT * 2
    post(
        server.url + "/v1/decisions",
        {
            "decision": {
                "id": "w",
                "state": base_state,
                "question": "x",
                "options": [{"id": "a", "description": "a"}, {"id": "b", "description": "b"}],
            }
        },
    )
    for k in option_counts:
        options = [{"id": f"o{i}", "description": f"team number {i}"} for i in range(k)]
        reply = post(
            server.url + "/v1/decisions",
            {
                "decision": {
                    "id": "k",
                    "state": base_state,
                    "question": "Which team?",
                    "options": options,
                }
            },
        )
        by_options[k] = {"tokens": reply.body["result"]["input_tokens"], "seconds": reply.seconds}
        progress(len(by_options), len(option_counts), "options")
    by_clients = {}
    for c in clients:

        def one(i: int, c: int = c) -> float:
            return post(
                server.url + "/v1/decisions",
                {
                    "decision": {
                        "id": f"c{i}",
                        "state": f"Client {i % c}: " + base_state,
                        "question": f"Which team? {i}",
                        "options": [
                            {"id": "a", "description": "a"},
                            {"id": "b", "description": "b"},
                        ],
                    }
                },
            ).seconds

        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(c) as pool:
            lat = list(pool.map(one, range(c * per_client)))
        wall = time.perf_counter() - start
        by_clients[c] = {"decisions_per_s": c * per_client / wall, "latency": summary(lat)}
        progress(len(by_clients), len(clients), "clients")
    memory = {"proxy": memory_kb(server.proc.pid)}  # type: ignore[union-attr]
    health = get_json(server.url + "/health")
    for key in ("llama_server", "llama_server_split"):  # the second one: CPU sharing dynamic
        if health.get(key, {}).get("pid"):
            memory[key] = memory_kb(health[key]["pid"])
    return {
        "by_state_length": by_length,
        "by_options": by_options,
        "by_clients": by_clients,
        "memory_kb": memory,
    }


# -- 7. Option order ------------------------------------------------------------------------------


def _rotated(decision: dict[str, Any], shift: int) -> dict[str, Any]:
    options = decision["options"]
    return {**decision, "options": options[shift:] + options[:shift], "return_prompt": False}


def option_order(server: ProxyProcess, limit: int | None, only: str | None) -> dict[str, Any]:
    """Does the answer follow the evidence or the place an option is listed in? Every item is
    asked once per cyclic rotation of its options, as a decision and as a greedy chat
    completion. A reader that ignores the evidence and favours a position picks the first-listed
    option far more than 1/n of the time and changes its answer as the options rotate. Then the
    same decision once more with `permutations: n` (the server asks every rotation as branches of
    one prefill and averages them), timed against the single order."""
    items = [(t.id, _choice_decision(t), t.expected) for t in tasks(limit, only)]
    routing = {
        "id": "password-reset",
        "state": ROUTING_STATE,
        "question": "Which queue should handle it?",
        "options": [{"id": i, "description": t} for i, t in ROUTING_OPTIONS],
    }
    items.insert(0, ("password-reset", routing, "account_access"))
    rows = []
    for k, (item_id, decision, expected) in enumerate(items):
        n = len(decision["options"])
        runs = []
        mean = dict.fromkeys((o["id"] for o in decision["options"]), 0.0)
        single_seconds = None
        for shift in range(n):
            asked = _rotated(decision, shift)
            ours = post(server.url + "/v1/decisions", {"decision": asked})
            if ours.status != 200:
                continue
            single_seconds = single_seconds or ours.seconds
            result = ours.body["result"]
            probs = dict(zip(result["option_ids"], result["probabilities"]))
            for key, value in probs.items():
                mean[key] += value / n
            _, text, chat_id = _ask_chat(server, asked)
            first = asked["options"][0]["id"]
            runs.append(
                {
                    "first_listed": first,
                    "decision_argmax": max(probs, key=probs.get),
                    "p_expected": probs[expected],
                    "chat_answer": text[:40],
                    "chat_argmax": chat_id,
                }
            )
        permuted = post(server.url + "/v1/decisions", {"decision": {**decision, "permutations": n}})
        served = dict(
            zip(permuted.body["result"]["option_ids"], permuted.body["result"]["probabilities"])
        )
        rows.append(
            {
                "id": item_id,
                "options": n,
                "expected": expected,
                "runs": runs,
                "rotation_mean": mean,
                "rotation_mean_argmax": max(mean, key=mean.get),
                "permuted": served,
                "permuted_argmax": max(served, key=served.get),
                "permuted_vs_client_mean": max(abs(served[i] - mean[i]) for i in mean),
                "single_seconds": single_seconds,
                "permuted_seconds": permuted.seconds,
            }
        )
        progress(k + 1, len(items), "option order")

    def share(path: str, test: Any) -> float:
        runs = [(r, run) for r in rows for run in r["runs"]]
        return sum(bool(test(r, run[path], run)) for r, run in runs) / max(len(runs), 1)

    def stable(path: str) -> float:
        return sum(len({run[path] for run in r["runs"]}) == 1 for r in rows) / max(len(rows), 1)

    paths = {"decision": "decision_argmax", "chat": "chat_argmax"}
    by_path = {
        name: {
            "accuracy": share(key, lambda r, a, run: a == r["expected"]),
            "first_listed_share": share(key, lambda r, a, run: a == run["first_listed"]),
            "same_answer_in_every_rotation": stable(key),
        }
        for name, key in paths.items()
    }
    chance_first = sum(len(r["runs"]) / r["options"] for r in rows) / max(
        sum(len(r["runs"]) for r in rows), 1
    )
    return {
        "items": len(rows),
        "runs": sum(len(r["runs"]) for r in rows),
        "by_path": by_path,
        "first_listed_share_if_position_blind": chance_first,
        "rotation_mean_accuracy": sum(r["rotation_mean_argmax"] == r["expected"] for r in rows)
        / max(len(rows), 1),
        "permuted_accuracy": sum(r["permuted_argmax"] == r["expected"] for r in rows)
        / max(len(rows), 1),
        "permuted_vs_client_mean_max": max(r["permuted_vs_client_mean"] for r in rows),
        "single_seconds": summary([r["single_seconds"] for r in rows]),
        "permuted_seconds": summary([r["permuted_seconds"] for r in rows]),
        "permuted_over_single_p50": summary([r["permuted_seconds"] for r in rows])["p50"]
        / summary([r["single_seconds"] for r in rows])["p50"],
        "routing_example": rows[0],
        "rows": rows,
    }
