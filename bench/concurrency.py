"""`concurrency`: N concurrent clients, the proxy against a stock llama-server with N slots.

Each round sends M distinct decision prompts (~290 tokens each, built deterministically: the
floor suite's decisions, a new state for every prompt of every round, so that no side holds a
state from an earlier round) through N clients (each takes the next prompt once its last one
is answered) to

- the proxy's `/v1/decisions`, as a default server runs (bench.common.start_server), and
- a stock llama-server started with `--parallel N` (bench/stock.py), scored the way the
  floor and generation suites ask llama-server for a decision: `/completion` of the decision's
  own prompt text, one token predicted, the top log-probabilities of as many tokens as there
  are options, greedy, prompt cache off (as the floor suite asks: the whole prompt evaluated).

Then the same N clients ask each side for one short chat completion each (`--concurrency-chat-
tokens` tokens, EOS ignored, so every answer is as long): the proxy forwards chat to its
llama-server, the stock server answers itself.

The sides alternate within the run (A B, B A, ...), both servers started once and held. The
stock server runs in the layout a default proxy runs on this machine (SEMIF_REPACK=auto), or
in both (`--stock-layouts both`; the proxy is then compared with the faster one).

Rates: decisions (chat tokens) per second of busy time. Each request's share of the time is
the integral over its span of 1 / (requests in flight): the shares of a round add up to the
time anything was in flight, which is the round's wall time once every client has started. A
side's rate is its decisions / the sum of their shares; its 95 % interval is a bootstrap of the
requests (their shares resampled, all rounds pooled): it carries how decisions and rounds of
this run differ, not how runs on other days would. The ratio proxy / stock pairs each prompt
with itself on the other side.

    python -m bench --model M.gguf --tag T concurrency [--clients 4 --prompts 16 --rounds 4]
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    BOOTSTRAP,
    MIN_PAIRS,
    SEED,
    Timed,
    get_json,
    post,
    progress,
    start_server,
    summary,
)
from bench.floor import floor_decision
from bench.stock import LAYOUTS, StockServer, layout_of

PROXY = "proxy"
PLACEHOLDER = "STATE-PLACEHOLDER-5c1e"


def decision(r: int, i: int, tokens: int) -> dict[str, Any]:
    """Prompt i of round r (r = -1: the untimed warm-up), its own state."""
    body = floor_decision(tokens, 900_000 + (r + 1) * 1_000 + i)
    body["decision"]["id"] = f"concurrency-{r}-{i}"
    return body


def chat(r: int, i: int, tokens: int) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": f"Write a short story about lighthouse {r}-{i}."}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,  # every answer is `tokens` long: the rates compare
    }


def prompt_template(url: str, tokens: int) -> str:
    """The decision's prompt text around its state, rendered by the proxy once (a state of one
    placeholder: a short, cheap prompt); the stock side's prompts are the state put in it,
    checked against the prompt each proxy decision returns."""
    body = decision(-2, 0, tokens)
    body["decision"]["state"] = PLACEHOLDER
    reply = post(url + "/v1/decisions", body)
    assert reply.status == 200, reply.body
    text = reply.body["result"]["prompt"]
    assert text.count(PLACEHOLDER) == 1, text
    return text


def prompt_text(template: str, body: dict[str, Any]) -> str:
    state = body["decision"]["state"]
    assert json.dumps(state)[1:-1] == state, "a state the template would escape"
    return template.replace(PLACEHOLDER, state)


def shares(spans: list[tuple[float, float]]) -> list[float]:
    """Each span's share of the busy time: the integral over it of 1 / (spans in flight)."""
    cuts = sorted({t for span in spans for t in span})
    out = [0.0] * len(spans)
    for a, b in itertools.pairwise(cuts):
        inside = [k for k, (s, e) in enumerate(spans) if s <= a and e >= b]
        for k in inside:
            out[k] += (b - a) / len(inside)
    return out


def clients(n: int, jobs: list[Callable[[], Timed]]) -> tuple[list[dict[str, Any]], float]:
    """`jobs` through n clients, each taking the next job once its last is answered: each
    job's span (seconds from the round's start), reply; and the round's wall time."""
    todo: queue.Queue[int] = queue.Queue()
    for k in range(len(jobs)):
        todo.put(k)
    done: list[dict[str, Any]] = [{} for _ in jobs]
    start = time.perf_counter()

    def client() -> None:
        while True:
            try:
                k = todo.get_nowait()
            except queue.Empty:
                return
            began = time.perf_counter() - start
            reply = jobs[k]()
            done[k] = {"start": began, "end": time.perf_counter() - start, "reply": reply}

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        for f in [pool.submit(client) for _ in range(n)]:
            f.result()
    wall = time.perf_counter() - start
    for row, share in zip(done, shares([(d["start"], d["end"]) for d in done]), strict=True):
        row["share"] = share
    return done, wall


# -- one side, one round ------------------------------------------------------------------------


class Side:
    def __init__(self, name: str, url: str, template: str, n_options: int) -> None:
        self.name, self.url, self.template, self.n_options = name, url, template, n_options
        self.decisions: list[dict[str, Any]] = []
        self.chats: list[dict[str, Any]] = []
        self.decision_walls: list[float] = []
        self.chat_walls: list[float] = []
        self.prompts_checked = 0

    def ask(self, body: dict[str, Any]) -> Callable[[], Timed]:
        if self.name == PROXY:
            return lambda: post(self.url + "/v1/decisions", body)
        request = {
            "prompt": prompt_text(self.template, body),
            "n_predict": 1,
            "n_probs": self.n_options,
            "temperature": 0,
            # As the floor suite asks: the whole prompt evaluated, none of it reused from the
            # slot's last prompt (llama-server's default would reuse the chat template's
            # opening, which the proxy evaluates for every new state).
            "cache_prompt": False,
        }
        return lambda: post(self.url + "/completion", request)

    def decisions_round(self, r: int, m: int, n: int, tokens: int) -> None:
        bodies = [decision(r, i, tokens) for i in range(m)]
        done, wall = clients(n, [self.ask(b) for b in bodies])
        self.decision_walls.append(wall)
        for i, (row, body) in enumerate(zip(done, bodies, strict=True)):
            reply = row.pop("reply")
            assert reply.status == 200, (self.name, reply.body)
            if self.name == PROXY:
                result = reply.body["result"]
                # The stock side scores the same text: the prompt it is sent is this one.
                assert result["prompt"] == prompt_text(self.template, body), "prompts differ"
                self.prompts_checked += 1
                tokens_in = result["input_tokens"]
                # Tokens of the prompt not evaluated for this decision (held from another).
                reused = result.get("timing", {}).get("prefix_reused_tokens") or 0
                evaluated = tokens_in - reused
            else:
                timings = reply.body["timings"]
                evaluated = timings["prompt_n"]
                tokens_in = evaluated + (timings.get("cache_n") or 0)
            self.decisions.append(
                {
                    "round": r,
                    "i": i,
                    **row,
                    "seconds": reply.seconds,
                    "prompt_tokens": tokens_in,
                    "evaluated_tokens": evaluated,
                }
            )

    def chats_round(self, r: int, n: int, tokens: int) -> None:
        def ask(i: int) -> Callable[[], Timed]:
            return lambda: post(self.url + "/v1/chat/completions", chat(r, i, tokens))

        done, wall = clients(n, [ask(i) for i in range(n)])
        self.chat_walls.append(wall)
        for i, row in enumerate(done):
            reply = row.pop("reply")
            assert reply.status == 200, (self.name, reply.body)
            got = reply.body["usage"]["completion_tokens"]
            self.chats.append({"round": r, "i": i, **row, "seconds": reply.seconds, "tokens": got})

    def raw(self) -> dict[str, Any]:
        return {
            "decisions": self.decisions,
            "decision_walls": self.decision_walls,
            "chats": self.chats,
            "chat_walls": self.chat_walls,
        }


# -- statistics ---------------------------------------------------------------------------------


def _aligned(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda x: (x["round"], x["i"]))


def rate(rows: list[dict[str, Any]], work: str | None = None) -> dict[str, Any]:
    """Work (decisions: 1 each; chats: their tokens) per second of busy time, with a bootstrap
    95 % interval over the requests (none under MIN_PAIRS requests)."""
    rows = _aligned(rows)
    w = np.asarray([x[work] if work else 1.0 for x in rows], dtype=float)
    s = np.asarray([x["share"] for x in rows], dtype=float)
    out: dict[str, Any] = {
        "n": len(rows),
        "point": float(w.sum() / s.sum()),
        "lo": None,
        "hi": None,
    }
    if len(rows) >= MIN_PAIRS:
        rng = np.random.default_rng(SEED)
        idx = rng.integers(0, len(rows), size=(BOOTSTRAP, len(rows)))
        lo, hi = np.percentile(w[idx].sum(axis=1) / s[idx].sum(axis=1), [2.5, 97.5])
        out.update(lo=float(lo), hi=float(hi))
    return out


def ratio(a: list[dict[str, Any]], b: list[dict[str, Any]], work: str | None = None) -> dict:
    """rate(a) / rate(b), the requests paired by (round, prompt): the same prompt on each side,
    resampled together."""
    a, b = _aligned(a), _aligned(b)
    assert [(x["round"], x["i"]) for x in a] == [(x["round"], x["i"]) for x in b]
    wa = np.asarray([x[work] if work else 1.0 for x in a], dtype=float)
    wb = np.asarray([x[work] if work else 1.0 for x in b], dtype=float)
    sa = np.asarray([x["share"] for x in a], dtype=float)
    sb = np.asarray([x["share"] for x in b], dtype=float)
    point = float((wa.sum() / sa.sum()) / (wb.sum() / sb.sum()))
    out: dict[str, Any] = {"n": len(a), "point": point, "lo": None, "hi": None}
    if len(a) >= MIN_PAIRS:
        rng = np.random.default_rng(SEED)
        idx = rng.integers(0, len(a), size=(BOOTSTRAP, len(a)))
        r = (wa[idx].sum(1) / sa[idx].sum(1)) / (wb[idx].sum(1) / sb[idx].sum(1))
        lo, hi = np.percentile(r, [2.5, 97.5])
        out.update(lo=float(lo), hi=float(hi))
    return out


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """Rates per side, the stock side the proxy is compared with (the faster, where both
    layouts ran) and the ratios proxy / that side; from the raw requests of a results file."""
    raw = result["raw"]
    out: dict[str, Any] = {"decisions_per_s": {}, "chat_tokens_per_s": {}, "per_round": {}}
    for name, side in raw.items():
        out["decisions_per_s"][name] = rate(side["decisions"])
        if side["chats"]:
            out["chat_tokens_per_s"][name] = rate(side["chats"], "tokens")
        rounds = sorted({x["round"] for x in side["decisions"]})
        out["per_round"][name] = [
            sum(x["round"] == r for x in side["decisions"]) / wall
            for r, wall in zip(rounds, side["decision_walls"], strict=True)
        ]
    stock = [n for n in raw if n != PROXY]
    ref = max(stock, key=lambda n: out["decisions_per_s"][n]["point"])
    out["reference"] = ref
    out["decisions_ratio"] = ratio(raw[PROXY]["decisions"], raw[ref]["decisions"])
    if raw[PROXY]["chats"]:
        chat_ref = max(stock, key=lambda n: out["chat_tokens_per_s"][n]["point"])
        out["chat_reference"] = chat_ref
        out["chat_ratio"] = ratio(raw[PROXY]["chats"], raw[chat_ref]["chats"], "tokens")
    tokens = [x["prompt_tokens"] for x in raw[PROXY]["decisions"]]
    out["prompt_tokens"] = summary([float(t) for t in tokens])
    out["evaluated_tokens_p50"] = {
        name: float(np.median([x.get("evaluated_tokens", x["prompt_tokens"]) for x in rows]))
        for name, rows in ((n, side["decisions"]) for n, side in raw.items())
    }
    return out


# -- the run ------------------------------------------------------------------------------------


def run(
    model: Path,
    n_clients: int = 4,
    n_prompts: int = 16,
    rounds: int = 4,
    tokens: int = 290,
    chat_tokens: int = 32,
    stock_layouts: str = "same",
) -> dict[str, Any]:
    load = {"start": list(os.getloadavg())}
    proxy = start_server(model)
    # The proxy's own layout (SEMIF_REPACK=auto, measured at its start): "same" gives the
    # stock server that one.
    repack = (get_json(proxy.url + "/health").get("model") or {}).get("repack") or {}
    proxy_layout = layout_of(bool(repack.get("on")))
    layouts = [proxy_layout] if stock_layouts == "same" else list(LAYOUTS)
    stock = [StockServer(model, layout, parallel=n_clients, ctx=8192) for layout in layouts]
    try:
        for server in stock:
            server.start()
        template = prompt_template(proxy.url, tokens)
        n_options = len(decision(0, 0, tokens)["decision"]["options"])
        sides = [Side(PROXY, proxy.url, template, n_options)]
        sides += [Side(f"stock-{s.layout}", s.url, template, n_options) for s in stock]
        # Untimed: a decision and a chat each, the one-off costs of a process's first requests.
        for side in sides:
            assert side.ask(decision(-1, 0, tokens))().status == 200
            if chat_tokens:
                assert post(side.url + "/v1/chat/completions", chat(-1, 0, 4)).status == 200
        health = get_json(proxy.url + "/health")
        order = []
        load["rounds"] = []
        for r in range(rounds):
            turn = sides if r % 2 == 0 else sides[::-1]
            order.append([s.name for s in turn])
            for side in turn:
                side.decisions_round(r, n_prompts, n_clients, tokens)
                if chat_tokens:
                    side.chats_round(r, n_clients, chat_tokens)
            load["rounds"].append(list(os.getloadavg()))
            progress(r + 1, rounds, "concurrency")
    finally:
        for server in stock:
            server.stop()
        proxy.stop()
    result: dict[str, Any] = {
        "clients": n_clients,
        "prompts_per_round": n_prompts,
        "rounds": rounds,
        "prompt_tokens_target": tokens,
        "chat_tokens": chat_tokens,
        "stock_layouts": stock_layouts,
        "proxy": {
            "layout": proxy_layout,
            "repack": (health.get("model") or {}).get("repack"),
            "cpu": health.get("cpu"),
            "llama_server_split": health.get("llama_server_split"),
        },
        "stock_servers": {f"stock-{s.layout}": s.describe() for s in stock},
        # What the stock side is asked per decision.
        "stock_request": {
            "path": "/completion",
            "n_predict": 1,
            "n_probs": n_options,
            "temperature": 0,
            "cache_prompt": False,
        },
        "order": order,
        "prompts_checked": sides[0].prompts_checked,
        "load_average": load,
        "raw": {s.name: s.raw() for s in sides},
    }
    result["summary"] = summarise(result)
    return result


def fmt_rate(r: dict[str, Any], digits: int = 3) -> str:
    if r["lo"] is None:
        return f"{r['point']:.{digits}f} (no interval: {r['n']} requests)"
    return f"{r['point']:.{digits}f} [{r['lo']:.{digits}f}, {r['hi']:.{digits}f}]"


def fmt_ratio(r: dict[str, Any]) -> str:
    if r["lo"] is None:
        return f"{r['point']:.2f}x (no interval: {r['n']} pairs)"
    return f"{r['point']:.2f}x [{r['lo']:.2f}, {r['hi']:.2f}]"


def headline(r: dict[str, Any]) -> str:
    s = r["summary"]
    ref = s["reference"]
    d = s["decisions_per_s"]
    parts = [
        f"{r['clients']} clients, {r['prompts_per_round']} prompts x {r['rounds']} rounds "
        f"(~{s['prompt_tokens']['p50']:.0f} tokens): decisions/s proxy {fmt_rate(d[PROXY])} vs "
        f"{ref} ({r['clients']} slots) {fmt_rate(d[ref])}, proxy/stock "
        f"{fmt_ratio(s['decisions_ratio'])}"
    ]
    for name in d:
        if name not in (PROXY, ref):
            parts.append(f"{name} {fmt_rate(d[name])}")
    if "chat_ratio" in s:
        c, cref = s["chat_tokens_per_s"], s["chat_reference"]
        parts.append(
            f"chat tokens/s proxy {fmt_rate(c[PROXY], 1)} vs {cref} {fmt_rate(c[cref], 1)}, "
            f"proxy/stock {fmt_ratio(s['chat_ratio'])}"
        )
    return "; ".join(parts)
