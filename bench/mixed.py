"""`mixed`: how the engine and llama-server share the CPU, measured per design.

For each design (SEMIF_CPU_SHARING=gate, dynamic, split) one server with otherwise default
settings runs three phases: decisions alone (4 clients), streaming chat alone (2 clients), and
both at once.
`mixed_rounds` repeats one phase (mixed, or one path alone), two designs alternating (A B,
B A, ...) for several rounds, so a difference between them can be told from this VM's drift:
each round's ratio A / B, and their spread. A design may be compared with itself: that
measures the noise.
Chat clients call back to back by default; with a chat gap each waits a random time before every
call (uniform, the gap on average, seeded), so chats also arrive while no other chat runs, as
real traffic does: under `dynamic` such a chat takes its cores from a decision's ubatch in
progress (preempted).
Two single-path servers give the optimum each path can reach on this machine: decisions with
SEMIF_CHAT=off, chat with SEMIF_DECISIONS=off. Decisions are ~350-token prompts on fresh states
(prefix cache off), chat answers are 64 generated tokens.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import settled, summary
from semif_proxy.testing.server import ProxyProcess

DECISION_CLIENTS = 4
CHAT_CLIENTS = 2
CHAT_TOKENS = 64
STATE = (
    "Customer email #{n}: I ordered a standing desk on the 3rd and paid by card. The courier "
    "marked it delivered yesterday, but nothing arrived; my neighbours have not seen it either. "
    "I already waited a day in case it was a scanning mistake. I need the desk for work and "
    "would like either a replacement shipped quickly or my money back. Order reference "
    "DX-{n}-5521, account under this email. Please tell me what happens next and how long it "
    "will take, and whether I have to file anything with the courier myself. "
)


def decision(n: int) -> dict[str, Any]:
    return {
        "decision": {
            "id": f"mixed-{n}",
            "state": STATE.format(n=n) * 2,
            "question": "Which support queue should handle this ticket?",
            "options": [
                {"id": "billing", "description": "Billing, invoices, refunds and payments"},
                {"id": "shipping", "description": "Delivery, tracking and lost parcels"},
                {"id": "account", "description": "Login, password and account access"},
                {"id": "product", "description": "Product defects and how-to questions"},
            ],
        }
    }


def chat(n: int) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": f"Write a short story about lighthouse {n}."}],
        "max_tokens": CHAT_TOKENS,
        "temperature": 0,
        "ignore_eos": True,  # every answer is CHAT_TOKENS long: rates compare
        "stream": True,
    }


async def decision_client(
    session: aiohttp.ClientSession,
    url: str,
    n: int,
    until: float,
    out: list[float],
    spans: list[tuple[float, float]],
) -> None:
    i = 0
    while time.monotonic() < until:
        i += 1
        start = time.monotonic()
        async with session.post(url + "/v1/decisions", json=decision(n * 10_000 + i)) as resp:
            await resp.read()
            if resp.status == 200:
                out.append(time.monotonic() - start)
                spans.append((start, time.monotonic()))


async def chat_client(
    session: aiohttp.ClientSession,
    url: str,
    n: int,
    until: float,
    out: list[dict[str, float]],
    in_window: list[int],
    gap: float = 0.0,
) -> None:
    rng = random.Random(n)  # the same gaps for every design
    i = 0
    while time.monotonic() < until:
        if gap:
            await asyncio.sleep(min(rng.uniform(0.0, 2 * gap), max(0.0, until - time.monotonic())))
            if time.monotonic() >= until:
                break
        i += 1
        start = time.perf_counter()
        first = None
        tokens = 0
        async with session.post(url + "/v1/chat/completions", json=chat(n * 10_000 + i)) as resp:
            if resp.status != 200:
                await resp.read()
                continue
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                delta = json.loads(line[6:])["choices"][0].get("delta", {})
                if delta.get("content"):
                    tokens += 1
                    first = first or time.perf_counter()
                    if time.monotonic() <= until:
                        in_window[0] += 1
        end = time.perf_counter()
        if first is not None and tokens > 1:
            out.append(
                {
                    "ttft": first - start,
                    "tokens": tokens,
                    "tokens_per_s": (tokens - 1) / (end - first),
                    "seconds": end - start,
                }
            )


async def phase(
    url: str, decisions: int, chats: int, seconds: float, chat_gap: float = 0.0
) -> dict[str, Any]:
    """Throughputs count the work done inside the window only: the decisions finished in it,
    plus the elapsed share of each one still running at its end, and the chat tokens received
    in it. (Dividing everything finished by the wall time, tail included, rewarded a design
    for how fast it finished the last requests alone, not for what it did under mixed load.)"""
    start = time.monotonic()
    until = start + seconds
    lat: list[float] = []
    spans: list[tuple[float, float]] = []
    streams: list[dict[str, float]] = []
    chat_tokens = [0]
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(
            *(decision_client(session, url, n, until, lat, spans) for n in range(decisions)),
            *(
                chat_client(session, url, 100 + n, until, streams, chat_tokens, chat_gap)
                for n in range(chats)
            ),
        )
        wall = time.monotonic() - start
    out: dict[str, Any] = {
        "clients": {"decision": decisions, "chat": chats},
        "seconds": seconds,
        "wall_seconds": wall,
    }
    if decisions:
        done = sum(1.0 if end <= until else (until - s) / (end - s) for s, end in spans)
        out["decision_seconds"] = summary(lat)
        out["decisions_completed"] = len(lat)
        out["decisions_per_s"] = done / seconds
    if chats:
        out["chat_gap_seconds"] = chat_gap
        out["chat_ttft_seconds"] = summary([s["ttft"] for s in streams])
        # Every one: a round has a dozen chats, so its p95 is its largest or next one; the
        # rounds' together give a tail worth the name.
        out["chat_ttfts"] = [s["ttft"] for s in streams]
        out["chat_tokens_per_s_per_stream"] = summary([s["tokens_per_s"] for s in streams])
        out["chat_calls_completed"] = len(streams)
        out["chat_tokens_per_s_total"] = chat_tokens[0] / seconds
    return out


def serve(model: Path, env: dict[str, str | None]) -> ProxyProcess:
    # The defaults a user gets, but for the cache (fresh states) and a queue long enough.
    base: dict[str, str | None] = {
        "SEMIF_PREFIX_CACHE_MB": "0",
        "SEMIF_MAX_QUEUE": "256",
        "SEMIF_THREADS": None,
        "SM_LLAMA_CPP_PARALLEL": None,
    }
    server = ProxyProcess(model, {**base, **env}).start(timeout=300)
    settled(server.url)
    return server


DESIGNS: dict[str, dict[str, str | None]] = {
    "gate": {"SEMIF_CPU_SHARING": "gate"},
    "dynamic": {"SEMIF_CPU_SHARING": "dynamic"},
    "split": {"SEMIF_CPU_SHARING": "split"},
    "none": {"SEMIF_CPU_SHARING": "none"},
    # Both processes' OpenMP threads sleep at barriers instead of spinning.
    "none-passive": {"SEMIF_CPU_SHARING": "none", "OMP_WAIT_POLICY": "passive"},
}


DEFAULT_DESIGNS = ("gate", "dynamic", "split")


def run(model: Path, seconds: float = 30.0, designs: tuple[str, ...] = DEFAULT_DESIGNS) -> dict:
    results: dict[str, Any] = {"seconds_per_phase": seconds, "designs": {}}
    server = serve(model, {"SEMIF_CHAT": "off"})
    try:
        results["optimum_decisions"] = asyncio.run(phase(server.url, DECISION_CLIENTS, 0, seconds))
        results["optimum_decisions"]["threads"] = server.call("GET", "/health").json()["cpu"]
    finally:
        server.stop()
    server = serve(model, {"SEMIF_DECISIONS": "off"})
    try:
        results["optimum_chat"] = asyncio.run(phase(server.url, 0, CHAT_CLIENTS, seconds))
    finally:
        server.stop()
    for design in designs:
        server = serve(model, DESIGNS[design])
        try:
            cpu = server.call("GET", "/health").json()["cpu"]
            results["designs"][design] = {
                "cpu": cpu,
                "decisions_alone": asyncio.run(phase(server.url, DECISION_CLIENTS, 0, seconds)),
                "chat_alone": asyncio.run(phase(server.url, 0, CHAT_CLIENTS, seconds)),
                "mixed": asyncio.run(phase(server.url, DECISION_CLIENTS, CHAT_CLIENTS, seconds)),
            }
            # What the design did meanwhile (dynamic: how many chats went to the split server).
            results["designs"][design]["cpu_after"] = server.call("GET", "/health").json()["cpu"]
        finally:
            server.stop()
    best_d = results["optimum_decisions"]["decision_seconds"]["p50"]
    best_c = results["optimum_chat"]["chat_tokens_per_s_per_stream"]["p50"]
    for r in results["designs"].values():
        r["decision_p50_over_optimum"] = r["decisions_alone"]["decision_seconds"]["p50"] / best_d
        r["chat_rate_over_optimum"] = (
            r["chat_alone"]["chat_tokens_per_s_per_stream"]["p50"] / best_c
        )
    return results


# The single-path servers the optimum comes from, as designs `mixed_rounds` can compare with.
OPTIMA: dict[str, dict[str, str | None]] = {
    "chat_off": {"SEMIF_CHAT": "off"},
    "decisions_off": {"SEMIF_DECISIONS": "off"},
}
PHASES = {"mixed": (DECISION_CLIENTS, CHAT_CLIENTS), "decisions": (DECISION_CLIENTS, 0)}
PHASES["chat"] = (0, CHAT_CLIENTS)


def check_rounds(designs: list[str], which: str) -> str | None:
    """What is wrong with a mixed_rounds request, before any server starts (None: fine)."""
    known = {**DESIGNS, **OPTIMA}
    if len(designs) != 2 or any(d not in known for d in designs):
        return f"mixed_rounds compares two of {', '.join(known)}; got {','.join(designs)}"
    # A single-path server cannot serve the other path: its clients would spin on 404s.
    serves = {"chat_off": "decisions", "decisions_off": "chat"}
    for d in designs:
        if d in serves and which != serves[d]:
            return f"{d} serves the {serves[d]} phase only, not {which}"
    return None


def _ratio(x: float, y: float) -> float:
    return x / y if y else float("nan")


def rounds(
    model: Path,
    seconds: float,
    designs: tuple[str, str],
    n: int,
    which: str = "mixed",
    chat_gap: float = 0.0,
) -> dict:
    """One phase (`which`: mixed, decisions or chat alone), `n` rounds of the two designs in
    alternating order; ratios of the first over the second per round (decisions/s, chat
    tokens/s: higher is better; TTFT, decision p50: lower is better), and each design's
    first-token times of all rounds together. A design may be one of OPTIMA, e.g. dynamic
    against chat_off with decisions alone."""
    decisions, chats = PHASES[which]
    runs: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])  # by position: A may be B
    for i in range(n):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            server = serve(model, {**DESIGNS, **OPTIMA}[designs[side]])
            try:
                result = asyncio.run(phase(server.url, decisions, chats, seconds, chat_gap))
                health = server.call("GET", "/health").json()
                # What ran: a dynamic server whose second llama-server was refused is the gate.
                result["cpu_after"] = health["cpu"]
                result["llama_server_split"] = health.get("llama_server_split")
                runs[side].append(result)
            finally:
                server.stop()
    keys = {}
    if decisions:
        keys["decisions_per_s"] = lambda m: m["decisions_per_s"]
        keys["decision_p50"] = lambda m: m["decision_seconds"]["p50"]
    if chats:
        keys["chat_tokens_per_s_total"] = lambda m: m["chat_tokens_per_s_total"]
        keys["chat_tokens_per_s_per_stream_p50"] = lambda m: m["chat_tokens_per_s_per_stream"][
            "p50"
        ]
        keys["chat_ttft_p50"] = lambda m: m["chat_ttft_seconds"]["p50"]
        keys["chat_ttft_p95"] = lambda m: m["chat_ttft_seconds"]["p95"]
    ratios = {
        key: [_ratio(get(x), get(y)) for x, y in zip(*runs, strict=True)]
        for key, get in keys.items()
    }
    pooled: dict[str, dict[str, float]] = {}
    if chats:
        pooled = {
            side: summary([t for m in runs[i] for t in m["chat_ttfts"]])
            for i, side in enumerate(("a", "b"))
        }
    return {
        "phase": which,
        "seconds_per_phase": seconds,
        "chat_gap_seconds": chat_gap,
        "designs": list(designs),
        "rounds": n,
        "runs": {"a": runs[0], "b": runs[1]},
        "ratios": ratios,
        "ratio_summary": {key: summary(values) for key, values in ratios.items()},
        "chat_ttft_pooled": pooled,
    }
