"""The server under pressure and abuse: load with small limits, fuzzed bodies, timeouts, a
llama-server killed mid-stream, clients that hang up. Real llama-server, SmolLM2; the real proxy
process where the process is what is watched (its memory, signals, children, hang-ups), the app
in this process for what it answers (fuzzed bodies, the deadline's 504)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semif_proxy.testing.server import ProxyProcess, wait_for
from tests.conftest import StartApp
from tests.helpers.app_server import AppServer
from tests.helpers.llama_gate import LlamaGate

LOAD_SECONDS = float(os.environ.get("SEMIF_LOAD_SECONDS", "20"))


def decision(i: int) -> dict:
    return {
        "decision": {
            "id": f"load-{i}",
            "state": f"Ticket {i}: the parcel arrived broken.",
            "question": "Which team handles it?",
            "options": [
                {"id": "shipping", "description": "Delivery and damage"},
                {"id": "billing", "description": "Payments"},
            ],
        }
    }


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def limited(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    log = tmp_path_factory.mktemp("logs") / "limited.log"
    server = ProxyProcess(
        model_path,
        {
            "SEMIF_MAX_IN_FLIGHT": "2",
            "SEMIF_MAX_QUEUE": "4",
            "SM_LLAMA_CPP_PARALLEL": "2",
            "SEMIF_UPSTREAM_ADMIN": "on",  # the tests read llama-server's GET /slots
            # What is tested here is admission (200, or 503 with Retry-After), not the
            # deadline: a request that queued behind 64 clients on a slow machine is not a 504.
            "SEMIF_REQUEST_TIMEOUT": "110",
        },
        log_path=log,
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fuzzed(model_path: Path) -> Iterator[AppServer]:
    """The small limits of `limited`, and llama-server capped at 8 generated tokens: a fuzzed
    chat body ({"messages": []} is a valid one) would otherwise generate up to the context
    size, and the deadline would be what the fuzz tests. In this process: what is fuzzed is
    what the app answers."""
    server = AppServer(
        model_path,
        {
            "SEMIF_MAX_IN_FLIGHT": "2",
            "SEMIF_MAX_QUEUE": "4",
            "SM_LLAMA_CPP_N_PREDICT": "8",
            "SEMIF_HEALTH_TIMEOUT": "10",  # a busy machine is not a stalled llama-server
        },
        preset="full",
    ).start()
    yield server
    server.stop()


async def _client(
    session: aiohttp.ClientSession, url: str, n: int, until: float, seen: list[dict]
) -> None:
    i = 0
    while time.monotonic() < until:
        i += 1
        rid = f"c{n}-{i}"
        chat = (n + i) % 3 == 0
        if chat:
            path = "/v1/chat/completions"
            body = {
                "messages": [{"role": "user", "content": f"Say the number {n}."}],
                "max_tokens": 4,
                "temperature": 0,
            }
        else:
            path, body = "/v1/decisions", decision(n * 100_000 + i)
        async with session.post(url + path, json=body, headers={"X-Request-Id": rid}) as resp:
            payload = await resp.json()
            seen.append(
                {
                    "rid": rid,
                    "kind": "chat" if chat else "decision",
                    "status": resp.status,
                    "echo": resp.headers.get("X-Request-Id"),
                    "retry_after": resp.headers.get("Retry-After"),
                    "sent_id": None if chat else body["decision"]["id"],
                    "body": payload,
                }
            )
        if resp.status == 503:
            await asyncio.sleep(0.05 * random.random())


async def _load(url: str, clients: int, seconds: float) -> list[dict]:
    seen: list[dict] = []
    until = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        await asyncio.gather(*(_client(session, url, n, until, seen) for n in range(clients)))
    return seen


def test_64_clients_get_200_or_503_with_retry_after(limited: ProxyProcess) -> None:
    assert limited.proc is not None
    warm = asyncio.run(_load(limited.url, 8, 2.0))  # allocations that happen once
    assert warm
    before = rss_kb(limited.proc.pid)
    cache_before = limited.call("GET", "/health").json()["prefix_cache"]["bytes"]
    seen = asyncio.run(_load(limited.url, 64, LOAD_SECONDS))
    after = rss_kb(limited.proc.pid)
    cache_after = limited.call("GET", "/health").json()["prefix_cache"]["bytes"]
    statuses = {r["status"] for r in seen}
    assert statuses <= {200, 503}, statuses
    ok = [r for r in seen if r["status"] == 200]
    refused = [r for r in seen if r["status"] == 503]
    assert ok and refused  # the limits were reached, and work still got done
    assert {r["kind"] for r in ok} == {"chat", "decision"}
    for r in seen:
        assert r["echo"] == r["rid"]  # every response is the answer to its own request
    for r in refused:
        assert int(r["retry_after"]) >= 1
        assert r["body"]["error"]["type"] == "overloaded"
        assert r["body"]["error"]["request_id"] == r["rid"]
    for r in ok:
        if r["kind"] == "decision":
            assert r["body"]["result"]["id"] == r["sent_id"]
        else:
            assert r["body"]["choices"][0]["message"]["role"] == "assistant"
    # Memory stable: beyond what the byte-bounded prefix cache took (every decision here has its
    # own state), no per-request growth worth speaking of after the warm-up.
    cache_growth_kb = (cache_after - cache_before) // 1024
    assert after - before - cache_growth_kb < 64 * 1024, (before, after, cache_growth_kb, len(seen))
    assert limited.call("GET", "/ping").status == 200
    metrics = limited.call("GET", "/metrics").body.decode()
    assert "semif_decision_rejected_total" in metrics


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
keys = st.sampled_from(
    ["decision", "decisions", "messages", "state", "questions", "model", "id", "options", "x"]
)


def nest(depth: int, key: str | None) -> Any:
    """A value nested depth levels deep: lists, or objects under one key."""
    value: Any = "x"
    for _ in range(depth):
        value = [value] if key is None else {key: value}
    return value


# Around and far beyond the 64 levels the proxy accepts, in the fields it reads.
deep_values = st.builds(
    nest, st.integers(1, 400), st.sampled_from([None, "state", "options", "content", "a"])
)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(keys, json_values, max_size=4).map(lambda v: json.dumps(v).encode()),
    st.dictionaries(keys, deep_values, min_size=1, max_size=2).map(
        lambda v: json.dumps(v).encode()
    ),
    st.builds(
        lambda d, junk: json.dumps({"decision": {**decision(0)["decision"], **d}}).encode() + junk,
        st.dictionaries(
            st.sampled_from(["id", "state", "question", "options"]),
            json_values | deep_values,
            max_size=2,
        ),
        st.sampled_from([b"", b"}", b"\x00", b"\xff"]),
    ),
)
ROUTES = ["/invocations", "/v1/decisions", "/v1/systemone", "/v1/chat/completions"]


def _post(port: int, path: str, raw: bytes, content_type: str) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(
            b"POST "
            + path.encode()
            + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
            + content_type.encode()
            + b"\r\nContent-Length: "
            + str(len(raw)).encode()
            + b"\r\n\r\n"
            + raw
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.timeout(1200)
@settings(
    max_examples=int(os.environ.get("SEMIF_FUZZ_EXAMPLES", "2000")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(
    path=st.sampled_from(ROUTES),
    raw=bodies,
    content_type=st.sampled_from(["application/json", "text/plain", ""]),
)
def test_fuzzed_bodies_never_5xx(
    fuzzed: ProxyProcess, path: str, raw: bytes, content_type: str
) -> None:
    """Whatever the body, every route answers with a 2xx or a 4xx, or with the one 503 that
    is allowed here: the queue is full ("overloaded", with Retry-After). An engine failure, an
    unavailable llama-server or a timeout is a failure of the test."""
    status, body = _post(fuzzed.port, path, raw, content_type)
    if status >= 500:
        assert status == 503, (status, path, raw[:200], body[:300])
        assert json.loads(body)["error"]["type"] == "overloaded", (path, raw[:200], body[:300])
    if status >= 400:
        error = json.loads(body)
        assert "error" in error or "detail" in error, (status, path, body[:300])


def test_server_healthy_after_fuzzing(fuzzed: ProxyProcess) -> None:
    assert fuzzed.call("GET", "/ping").status == 200
    assert fuzzed.call("POST", "/invocations", decision(1)).json()["result"]["id"] == "load-1"


def test_slow_decision_times_out_with_504(model_path: Path, start_app: StartApp) -> None:
    server = start_app(model_path, {"SEMIF_CHAT": "off", "SEMIF_REQUEST_TIMEOUT": "0.01"})
    try:
        body = decision(2)
        body["decision"]["state"] = "A long ticket. " * 300
        reply = server.call("POST", "/v1/decisions", body)
        assert reply.status == 504 and reply.json()["error"]["type"] == "timeout"
        assert "SEMIF_REQUEST_TIMEOUT" in reply.json()["error"]["message"]
        assert server.call("GET", "/ping").status == 200
    finally:
        assert server.stop() == 0


def _stream_request(port: int, max_tokens: int) -> socket.socket:
    request = json.dumps(
        {
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: "
        + str(len(request)).encode()
        + b"\r\nConnection: close\r\n\r\n"
        + request
    )
    return sock


def _slots_busy(server: ProxyProcess) -> int:
    slots = server.call("GET", "/slots").json()
    return sum(1 for s in slots if s.get("is_processing"))


def test_killed_llama_server_mid_stream_ends_with_an_error_event(
    model_path: Path, tmp_path: Path
) -> None:
    gate = LlamaGate(tmp_path)
    server = ProxyProcess(model_path, gate.env, log_path=tmp_path / "kill.log").start()
    try:
        pid = server.call("GET", "/health").json()["llama_server"]["pid"]
        gate.close()  # the restart after the kill waits for the test
        sock = _stream_request(server.port, 2000)
        got = b""
        while got.count(b"data: ") < 3:
            got += sock.recv(65536)
        os.kill(pid, signal.SIGKILL)
        while chunk := sock.recv(65536):
            got += chunk
        sock.close()
        # Chunked framing aside, the last server-sent event is our JSON error, not [DONE].
        last = got.rsplit(b"data: ", 1)[1].split(b"\n\n", 1)[0]
        assert json.loads(last)["error"]["type"] == "upstream_error", last
        assert b"[DONE]" not in got and got.count(b"data: ") >= 4
        during = server.call("POST", "/v1/decisions", decision(3))
        assert during.status == 200
        # Chat while llama-server restarts: a clean JSON 503 with Retry-After, never a hang
        # or a 500.
        chat_body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        chat = server.call("POST", "/v1/chat/completions", chat_body)
        assert chat.status == 503 and int(chat.headers["Retry-After"]) >= 1
        assert chat.json()["error"]["type"] == "unavailable"
        assert "llama-server is not ready" in chat.json()["error"]["message"]
        gate.open()
        wait_for(lambda: server.call("GET", "/ping").status == 200, 120, "llama-server back")
        assert server.call("POST", "/v1/chat/completions", chat_body).status == 200
    finally:
        assert server.stop() == 0


def test_client_disconnect_cancels_the_upstream_generation(limited: ProxyProcess) -> None:
    sock = _stream_request(limited.port, 4000)
    got = b""
    while got.count(b"data: ") < 2:
        got += sock.recv(65536)
    assert _slots_busy(limited) >= 1
    sock.close()  # hang up mid-answer
    # Left alone, the answer would run until its slot's context is full (~2,000 tokens, tens
    # of seconds here, longer on a busy machine); it stops within a token or two instead.
    wait_for(lambda: _slots_busy(limited) == 0, 10, "llama-server to stop for a client that left")


def test_sigterm_lets_in_flight_requests_finish(model_path: Path, tmp_path: Path) -> None:
    import threading

    log = tmp_path / "term.log"
    server = ProxyProcess(model_path, {"SEMIF_CHAT": "off"}, log_path=log).start()
    body = decision(4)
    body["decision"]["state"] = "A long ticket about a broken parcel. " * 120
    result: dict = {}

    def slow_request() -> None:
        result["reply"] = server.call("POST", "/v1/decisions", body, {"X-Request-Id": "inflight"})

    worker = threading.Thread(target=slow_request)
    worker.start()
    wait_for(lambda: server.metric("semif_engine_job_running") == 1, 60, "the request's job")
    assert server.stop(signal.SIGTERM) == 0
    worker.join(60)
    assert result["reply"].status == 200 and result["reply"].json()["result"]["id"] == "load-4"
    # One JSON log line per request: id, route, status, latency, tokens.
    lines = [json.loads(li) for li in log.read_text().splitlines() if li.startswith("{")]
    access = [li for li in lines if li.get("request_id") == "inflight" and "latency_ms" in li]
    assert len(access) == 1
    assert access[0]["route"] == "/v1/decisions" and access[0]["status"] == 200
    assert access[0]["tokens"] > 100


def test_killing_the_proxy_leaves_no_llama_server(model_path: Path) -> None:
    server = ProxyProcess(model_path).start()
    pid = server.call("GET", "/health").json()["llama_server"]["pid"]
    assert server.proc is not None
    server.proc.kill()  # SIGKILL: no chance to clean up; the kernel's parent-death signal does
    server.proc.wait(30)
    deadline = time.monotonic() + 30
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().split()[2] == "Z":
            break  # dead, waiting for its (adopted) parent to reap it
        assert time.monotonic() < deadline, "llama-server outlived its parent"
        time.sleep(0.1)
