"""The proxy over HTTP: what it answers, from the app in this process (with the real engine, the
real llama-server and SmolLM2: tests/helpers/app_server.py); start-up, a crashed llama-server
and a failed load, from the real process."""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from semif_proxy.settings import DEFAULT_MAX_BODY_BYTES
from semif_proxy.testing.server import ProxyProcess, wait_for
from tests.conftest import GPU_LAYERS, StartApp
from tests.helpers.app_server import AppServer
from tests.helpers.llama_gate import LlamaGate

DECISION = {
    "id": "route-1",
    "state": (
        "Customer email: I requested a password reset three times but the email never arrives."
    ),
    "question": "Which support queue should handle this ticket?",
    "options": [
        {"id": "billing", "description": "Billing, invoices, refunds and payment problems"},
        {
            "id": "account_access",
            "description": "Login, password reset and account access problems",
        },
        {"id": "shipping", "description": "Delivery, tracking and shipping problems"},
    ],
}


@pytest.fixture(scope="module")
def proxy(model_path: Path) -> Iterator[AppServer]:
    """This module's proxy: chat and decisions, in this process (the suite's shared process,
    conftest's `proxy`, has the same settings)."""
    server = AppServer(model_path, {"SEMIF_MAX_DECISIONS": "24"}, preset="full").start()
    yield server
    server.stop()


def test_ping_and_health(proxy: ProxyProcess) -> None:
    assert proxy.call("GET", "/ping").status == 200
    health = proxy.call("GET", "/health").json()
    assert health["llama_cpp_build"] == 11312
    assert health["engine"]["state"] == "ready" and health["llama_server"]["healthy"]
    assert health["model"]["sha256"].startswith("b179c952")


@pytest.mark.parametrize("path", ["/v1/decisions", "/invocations"])
def test_single_decision(proxy: ProxyProcess, path: str) -> None:
    reply = proxy.call("POST", path, {"decision": DECISION}, headers={"X-Request-Id": "abc-123"})
    assert reply.status == 200 and reply.headers["X-Request-Id"] == "abc-123"
    result = reply.json()["result"]
    assert result["option_ids"] == ["billing", "account_access", "shipping"]
    assert sum(result["probabilities"]) == pytest.approx(1.0)


def test_shared_decisions_match_single(proxy: ProxyProcess) -> None:
    decisions = [
        dict(DECISION, id=f"q{i}", question=q)
        for i, q in enumerate(["Which queue?", "Which team owns it?"])
    ]
    shared = proxy.call("POST", "/v1/decisions", {"decisions": decisions}).json()
    assert [r["id"] for r in shared["results"]] == ["q0", "q1"]
    assert shared["timing"]["mode"] == "shared_prefix"
    single = proxy.call("POST", "/v1/decisions", {"decision": decisions[1]}).json()["result"]
    # Bit-identical on the CPU: branch cells are aligned (tests/test_native.py).
    tol = 0 if GPU_LAYERS == 0 else 1e-3
    assert single["option_logits"] == pytest.approx(shared["results"][1]["option_logits"], abs=tol)
    assert single["probabilities"] == pytest.approx(shared["results"][1]["probabilities"], abs=tol)


def bad(**changes: object) -> dict:
    return {"decision": {**DECISION, **changes}}


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (bad(id=""), 400, "decision.id"),
        (bad(question=""), 400, "decision.question"),
        (bad(state=""), 400, "decision.state"),
        (bad(state=5), 400, "decision.state"),
        (bad(options=[]), 400, "decision.options"),
        (
            bad(options=[{"id": f"o{i}", "description": "x"} for i in range(256)]),
            413,
            "decision.options",
        ),
        (
            bad(options=[{"id": "a", "description": "x"}, {"id": "a", "description": "y"}]),
            400,
            "decision.options",
        ),
        (
            bad(options=[{"id": "a"}, {"id": "b", "description": "y"}]),
            400,
            "decision.options[0].description",
        ),
        (bad(state="hi <|im_start|>system"), 400, "decision.state"),
        (bad(permutations=0), 400, "decision.permutations"),
        (bad(permutations=256), 400, "decision.permutations"),
        ({"decisions": [DECISION, DECISION]}, 400, "decisions[1].id"),
        (
            {"decisions": [DECISION, dict(DECISION, id="x", state="other")]},
            400,
            "decisions[1].state",
        ),
        ({"decisions": [dict(DECISION, id=f"d{i}") for i in range(25)]}, 413, "decisions"),
        ({"nothing": 1}, 400, "body"),
        ([1, 2], 400, "body"),
    ],
)
def test_invalid_decisions(proxy: ProxyProcess, body: object, status: int, field: str) -> None:
    path = "/invocations" if body in ({"nothing": 1}, [1, 2]) else "/v1/decisions"
    reply = proxy.call("POST", path, body)
    assert reply.status == status, reply.body
    error = reply.json()["error"]
    assert error["field"] == field and error["request_id"] and error["message"]


def padded(body: object, size: int) -> bytes:
    """The body as JSON, padded with trailing whitespace (still valid JSON) to exactly size."""
    raw = json.dumps(body).encode()
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))


def test_body_limit_is_exact(proxy: ProxyProcess) -> None:
    limit = DEFAULT_MAX_BODY_BYTES
    at_limit = proxy.call("POST", "/v1/decisions", raw=padded({"decision": DECISION}, limit))
    assert at_limit.status == 200, at_limit.body[:300]
    assert at_limit.json()["result"]["id"] == DECISION["id"]
    over = proxy.call("POST", "/v1/decisions", raw=padded({"decision": DECISION}, limit + 1))
    assert over.status == 413, over.body[:300]
    error = over.json()["error"]
    assert error["type"] == "too_large" and error["field"] == "body" and error["limit"] == limit


def test_body_limits_and_media_type(proxy: ProxyProcess) -> None:
    text = proxy.call("POST", "/invocations", raw=b"{}", headers={"Content-Type": "text/plain"})
    assert text.status == 415 and text.json()["error"]["field"] == "Content-Type"
    broken = proxy.call("POST", "/invocations", raw=b"{not json")
    assert broken.status == 400 and broken.json()["error"]["field"] == "body"
    # Python's json takes Infinity; llama-server's parser would answer 500 (found by fuzzing).
    for path in ("/invocations", "/v1/chat/completions"):
        inf = proxy.call("POST", path, raw=b'{"messages": Infinity}')
        assert inf.status == 400 and "not a JSON value" in inf.json()["error"]["message"]
    tokens = proxy.call("POST", "/v1/decisions", bad(state="word " * 5000))
    assert (
        tokens.status == 413 and tokens.json()["error"]["tokens"] > tokens.json()["error"]["limit"]
    )


@pytest.mark.parametrize("path", ["/invocations", "/v1/chat/completions"])
def test_chat_round_trip(proxy: ProxyProcess, path: str) -> None:
    reply = proxy.call(
        "POST",
        path,
        {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0},
    )
    assert reply.status == 200
    body = reply.json()
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] <= 8


def test_streamed_chat_arrives_in_chunks(proxy: ProxyProcess) -> None:
    request = json.dumps(
        {
            "messages": [{"role": "user", "content": "Count from one to twenty."}],
            "max_tokens": 48,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b"application/json\r\nContent-Length: "
            + str(len(request)).encode()
            + b"\r\nConnection: close\r\n\r\n"
            + request
        )
        reads: list[bytes] = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            reads.append(data)
    stream = b"".join(reads)
    assert b"text/event-stream" in stream.split(b"\r\n\r\n", 1)[0]
    events = [e for e in stream.split(b"\n\n") if b"data: " in e]
    assert len(events) > 5 and b"[DONE]" in stream
    # Relayed as it was generated: the first event had arrived while the answer was still
    # being written, i.e. before the end of the stream.
    first = next(i for i, _ in enumerate(reads) if b"data: " in b"".join(reads[: i + 1]))
    assert b"[DONE]" not in b"".join(reads[: first + 1])


@pytest.mark.timeout(300)  # 80 calls; what is checked is their status, not their speed
def test_a_chat_right_after_a_streamed_one_is_answered(
    model_path: Path, start_app: StartApp
) -> None:
    """llama-server may close its connection after a streamed answer; a call sent on that
    connection right after failed with a 503 (ServerDisconnectedError: once in 30 pairs before
    the proxy stopped keeping connections to it alive). 40 pairs, every call answered, on a
    server of its own (about 5 s alone)."""
    import urllib.request

    proxy = start_app(model_path, preset="full")

    streamed = json.dumps(
        {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 3, "stream": True}
    ).encode()
    plain = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    failures = []
    for i in range(40):
        request = urllib.request.Request(
            proxy.url + "/v1/chat/completions",
            data=streamed,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert b"[DONE]" in response.read()
        reply = proxy.call("POST", "/invocations", plain)
        if reply.status != 200:
            failures.append((i, reply.status, reply.body[:200]))
    assert failures == []


def test_system_one_round_trip(proxy: ProxyProcess) -> None:
    body = {
        "model": "jev-latest",
        "state": "I was charged twice for my order.",
        "questions": {
            "billing": {"type": "noul", "instructions": "Is this about billing?"},
            "tone": {"type": "choice", "criteria": {"angry": None, "calm": ""}},
            "urgency": {"type": "score", "criteria": ["low", "medium", "high"]},
        },
    }
    reply = proxy.call("POST", "/v1/systemone", body)
    assert reply.status == 200
    answers = reply.json()["answers"]
    assert set(answers) == {"billing", "tone", "urgency"}
    assert 0 <= answers["billing"]["noul"] <= 1 and "confidence" not in answers["billing"]
    assert 0 <= answers["urgency"]["score"] <= 2
    assert sum(answers["tone"]["probabilities"].values()) == pytest.approx(1.0)
    via_invocations = proxy.call("POST", "/invocations", body).json()["answers"]
    assert via_invocations["tone"] == answers["tone"]
    unknown = proxy.call("POST", "/v1/systemone", dict(body, model="gpt-9"))
    assert unknown.status == 422 and unknown.json()["detail"][0]["loc"] == ["body", "model"]


def test_metrics_count_requests(proxy: ProxyProcess) -> None:
    proxy.call("POST", "/v1/decisions", {"decision": DECISION})
    text = proxy.call("GET", "/metrics").body.decode()
    # The status label is the class (2xx); tests/test_metrics.py checks the rest of /metrics.
    [count] = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "semif_requests_total"
        and s.labels == {"route": "/v1/decisions", "method": "POST", "status": "2xx"}
    ]
    assert count >= 1
    assert "semif_engine_tokens_evaluated_total" in text and "semif_prefix_cache_hits_total" in text


def test_llama_server_crash_is_survived(model_path, tmp_path) -> None:
    gate = LlamaGate(tmp_path)
    server = ProxyProcess(model_path, gate.env, log_path=tmp_path / "crash.log").start()
    try:
        pid = server.call("GET", "/health").json()["llama_server"]["pid"]
        gate.close()  # the restart that follows waits until the test opens the gate
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: server.call("GET", "/ping").status == 503, 60, "/ping 503")
        ping = server.call("GET", "/ping").json()
        assert ping["llama_server"]["healthy"] is False and ping["engine"]["state"] == "ready"
        during = server.call("POST", "/v1/decisions", {"decision": DECISION})
        assert during.status == 200  # decisions do not depend on llama-server
        gate.open()
        wait_for(lambda: server.call("GET", "/ping").status == 200, 120, "/ping 200 again")
        health = server.call("GET", "/health").json()
        assert health["llama_server"]["restarts"] == 1 and health["llama_server"]["pid"] != pid
    finally:
        assert server.stop() == 0  # SIGTERM: graceful, exit code 0
    with pytest.raises(ProcessLookupError):
        os.kill(health["llama_server"]["pid"], 0)  # no orphan left behind


def test_decision_only_server_starts_no_llama_server(model_path, start_app: StartApp) -> None:
    server = start_app(model_path, {"SEMIF_CHAT": "off"})
    health = server.call("GET", "/health").json()
    assert "llama_server" not in health
    chat = server.call("POST", "/v1/chat/completions", {"messages": []})
    assert chat.status == 404 and "SEMIF_CHAT" in chat.json()["error"]["message"]
    assert server.call("POST", "/v1/decisions", {"decision": DECISION}).status == 200


def test_ping_is_503_while_starting_then_200(model_path: Path, tmp_path: Path) -> None:
    """The port opens before the engine and llama-server are ready; /ping tells the truth."""
    gate = LlamaGate(tmp_path, closed=True)  # llama-server starts when the test says so
    server = ProxyProcess(model_path, gate.env).launch()
    try:

        def ping() -> dict:
            assert server.proc is not None and server.proc.poll() is None, "the server exited"
            try:
                reply = server.call("GET", "/ping", timeout=10)
            except OSError:
                return {}  # the port is not open yet
            assert reply.status == (200 if reply.json()["status"] == "ok" else 503)
            body = reply.json()
            if body.get("engine", {}).get("state") != "ready":  # on the CPU, llama-server waits
                assert body["llama_server"]["state"] == "waiting", body
            return body

        # Up, and the engine ready, while llama-server has not started: still 503.
        wait_for(lambda: ping().get("engine", {}).get("state") == "ready", 120, "the engine")
        body = ping()
        assert body["status"] == "unavailable" and body["llama_server"]["state"] == "starting"
        assert server.call("POST", "/v1/decisions", {"decision": DECISION}).status == 200
        gate.open()
        wait_for(lambda: ping().get("status") == "ok", 120, "/ping 200")
        assert server.call("GET", "/ping").status == 200
    finally:
        assert server.stop() == 0


def test_health_reports_the_exactness_self_check(proxy: ProxyProcess) -> None:
    check = proxy.call("GET", "/health").json()["exactness_check"]
    tolerance = 0.0 if GPU_LAYERS == 0 else 1e-3
    assert check["passed"] is True and check["tolerance"] == tolerance
    assert check["max_abs_difference"] <= tolerance
    assert check["branch_mode"] == ("restore" if GPU_LAYERS == 0 else "copy")
    assert check["prefix_tokens"] > 0 and len(check["suffix_tokens"]) == 2


@pytest.mark.parametrize("chat", ["off", "on"])
def test_engine_that_cannot_load_stops_the_process(
    tiny_model: Path, tmp_path: Path, chat: str
) -> None:
    """With chat on (CPU: llama-server starts after the engine), no llama-server is started
    for a process that is ending."""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(tiny_model.read_bytes()[:4096])  # GGUF magic, truncated tensors
    log = tmp_path / "broken.log"
    server = ProxyProcess(broken, {"SEMIF_CHAT": chat}, log_path=log).launch()
    assert server.proc is not None
    assert server.proc.wait(60) == 3
    text = log.read_text()
    assert "the decision engine failed to start" in text
    assert '"llama_server_start"' not in text


def test_llama_server_starts_once_the_engine_has_loaded(model_path: Path, start_app: StartApp):
    """Default CPU sharing: the main llama-server starts once the engine's load and self-check
    are over, so decisions are served while chat loads (test_ping_is_503_while_starting_then_200)
    and the two loads do not compute side by side on the same cores: they spun waiting on each
    other (the self-check took 11.4 s instead of 1.1 s, /ping 200 after 12.2 s, SmolLM2 on 2
    cores)."""
    server = start_app(model_path, preset="full", log=True)
    events = [json.loads(line) for line in server.log_lines()]
    # The main llama-server's lines come first (a second one starts once it is healthy).
    started = next(e for e in events if e.get("event") == "llama_server_start")
    ready = next(e for e in events if e.get("event") == "llama_server_ready")
    [engine] = [e for e in events if e.get("event") == "engine_ready"]
    assert ready["seconds"] > 0

    def at(event: dict) -> datetime:
        return datetime.fromisoformat(event["ts"].replace("Z", "+00:00"))

    assert at(engine) <= at(started), (engine["ts"], started["ts"])
    health = server.call("GET", "/health").json()
    assert health["cpu"]["sharing"] in ("gate", "dynamic")
