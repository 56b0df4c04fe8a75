"""The deployed path as SageMaker runs it and as trouble finds it: the platform's argv, its 60 s
invocation cut, a llama-server that stalls (SIGSTOP/SIGCONT) or stays stalled, clients that hang
up during a long prefill, the largest bodies the limits allow, and what /ping promises.

Real proxy, real llama-server, real SmolLM2 (the tiny generated models where a property of the
model is what is tested); what /ping says of a model the engine refuses, from the app in this
process."""

from __future__ import annotations

import http.client
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from semif_proxy import cli, entrypoint
from semif_proxy.settings import DEFAULT_MAX_BODY_BYTES, SettingsError, load_settings
from semif_proxy.testing.server import ProxyProcess, Reply, wait_for
from tests.conftest import StartApp

# Probe fast, and never restart on failed probes unless a test asks for it.
WATCH = {
    "SEMIF_HEALTH_INTERVAL": "0.2",
    "SEMIF_HEALTH_TIMEOUT": "0.5",
    "SEMIF_MAX_FAILED_PROBES": "1000",
}
ROUTING = {
    "id": "route-1",
    "state": "Customer email: I requested a password reset three times but it never arrives.",
    "question": "Which support queue should handle this ticket?",
    "options": [
        {"id": "billing", "description": "Billing, invoices, refunds and payment problems"},
        {"id": "account_access", "description": "Login, password reset and account access"},
        {"id": "shipping", "description": "Delivery, tracking and shipping problems"},
    ],
}
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, "temperature": 0}


def status_of(server: ProxyProcess, method: str, path: str, body: object = None) -> int:
    try:
        return server.call(method, path, body, timeout=10).status
    except OSError:
        return -1


def long_state(tokens: int) -> str:
    # SmolLM2 reads "ticket 123 is late. " as about 7.8 tokens.
    return " ".join(f"ticket {i} is late." for i in range(tokens * 10 // 78))


@pytest.fixture(scope="module")
def watched(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    log = tmp_path_factory.mktemp("logs") / "watched.log"
    server = ProxyProcess(model_path, WATCH, log_path=log).start()
    yield server
    server.stop()


# -- start-up as the platform does it ---------------------------------------------------------


def test_defaults_fit_sagemaker_limits(model_path: Path) -> None:
    settings = load_settings({}, model=str(model_path))
    assert settings.request_timeout < 60  # SageMaker cuts a real-time invocation at 60 s
    assert settings.llama_server_start_timeout == 600  # what SageMaker allows for start-up
    custom = load_settings({"SEMIF_LLAMA_SERVER_START_TIMEOUT": "900"}, model=str(model_path))
    assert custom.llama_server_start_timeout == 900


def test_entrypoint_refuses_anything_but_serve_in_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "semif_proxy.entrypoint", "train"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "'train'" in out.stderr and "serve" in out.stderr


def test_off_sagemaker_the_defaults_are_closed(model_path: Path) -> None:
    """`semif-proxy serve` listens on loopback and keeps /invocations behind the key unless told
    otherwise; the image's entrypoint sets the other defaults (below)."""
    settings = load_settings({}, model=str(model_path))
    assert settings.host == "127.0.0.1" and settings.invocations_public is False
    env = {"SEMIF_INVOCATIONS_PUBLIC": "true", "SEMIF_HOST": "0.0.0.0"}
    opened = load_settings(env, model=str(model_path))
    assert opened.host == "0.0.0.0" and opened.invocations_public is True
    with pytest.raises(SettingsError, match="SEMIF_INVOCATIONS_PUBLIC"):
        load_settings({"SEMIF_INVOCATIONS_PUBLIC": "maybe"}, model=str(model_path))


@pytest.mark.parametrize(
    ("argv", "env", "host", "public"),
    [
        (["serve"], {}, "0.0.0.0", "true"),  # SageMaker: its edge authenticates /invocations
        ([], {}, "0.0.0.0", None),  # `docker run -p <image>`: no SageMaker in front
        # A value set explicitly wins (blank counts as unset, as settings.py reads it).
        (["serve"], {"SEMIF_INVOCATIONS_PUBLIC": "false"}, "0.0.0.0", "false"),
        (
            ["serve"],
            {"SEMIF_HOST": "127.0.0.1", "SEMIF_INVOCATIONS_PUBLIC": " "},
            "127.0.0.1",
            "true",
        ),
        ([], {"SEMIF_INVOCATIONS_PUBLIC": "on"}, "0.0.0.0", "on"),
    ],
)
def test_entrypoint_defaults_where_unset(
    argv: list[str],
    env: dict[str, str],
    host: str,
    public: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A copy: what the entrypoint sets must not leak into the servers later tests start.
    names = ("SEMIF_HOST", "SEMIF_INVOCATIONS_PUBLIC")
    copy = {k: v for k, v in os.environ.items() if k not in names}
    monkeypatch.setattr(os, "environ", {**copy, **env})
    seen: dict[str, object] = {}

    def serve(args: list[str]) -> int:
        seen["argv"] = args
        seen["env"] = {k: os.environ.get(k) for k in names}
        return 0

    monkeypatch.setattr(cli, "main", serve)
    assert entrypoint.main(argv) == 0
    assert seen == {
        "argv": ["serve"],
        "env": {"SEMIF_HOST": host, "SEMIF_INVOCATIONS_PUBLIC": public},
    }


@pytest.mark.parametrize("argv", [["serve"], []], ids=["serve", "no-arguments"])
def test_entrypoint_serves_with_sagemakers_argv(
    argv: list[str], model_path: Path, tmp_path: Path
) -> None:
    # SageMaker's layout: the model unpacked read-only under /opt/ml/model, no --model flag.
    model_dir = tmp_path / "ml" / "model"
    model_dir.mkdir(parents=True)
    (model_dir / model_path.name).symlink_to(model_path)
    model_dir.chmod(0o555)
    key = "s3cr3t-sm"
    env = {
        "SM_LLAMA_CPP_MODEL_DIR": str(model_dir),
        "SEMIF_CHAT": "off",
        "SEMIF_API_KEY": key,
        "SEMIF_HOST": None,  # the image's default
    }
    server = ProxyProcess(None, env, log_path=tmp_path / "entrypoint.log")
    server.command = [sys.executable, "-m", "semif_proxy.entrypoint", *argv]
    sagemaker = argv == ["serve"]
    try:
        server.start()
        # `serve` is SageMaker's argv: its edge authenticates /invocations, which sends no key
        # of ours. With no arguments (`docker run -p`) it needs the key like every route.
        keyless = server.call("POST", "/invocations", {"decision": ROUTING})
        assert keyless.status == (200 if sagemaker else 401), keyless.body[:300]
        keyed = server.call(
            "POST", "/invocations", {"decision": ROUTING}, {"Authorization": f"Bearer {key}"}
        )
        assert keyed.status == 200, keyed.body[:300]
        assert server.call("POST", "/v1/decisions", {"decision": ROUTING}).status == 401
        # Every address, as SageMaker (or `docker run -p`) needs; the log line says so.
        events = [json.loads(li) for li in server.log_lines()]
        [listening] = [e for e in events if e.get("event") == "listening"]
        assert (listening["host"], listening["port"]) == ("0.0.0.0", server.port)
        assert listening["api_key_set"] is True
        assert listening["invocations_public"] is sagemaker
        assert key not in server.log_path.read_text()
    finally:
        assert server.stop() == 0
        model_dir.chmod(0o755)


# -- liveness that heals itself ---------------------------------------------------------------


def test_ping_and_chat_recover_after_llama_server_resumes(watched: ProxyProcess) -> None:
    pid = watched.call("GET", "/health").json()["llama_server"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: status_of(watched, "GET", "/ping") == 503, 10, "/ping 503 when stalled")
        chat = watched.call("POST", "/v1/chat/completions", CHAT, timeout=10)
        assert chat.status == 503 and int(chat.headers["Retry-After"]) >= 1
        # Decisions do not depend on llama-server, and /ping never waits on the stalled child:
        # a stopped llama-server never answers, so a /ping that asked it would not answer
        # either (status_of gives up after 10 s).
        assert watched.call("POST", "/v1/decisions", {"decision": ROUTING}).status == 200
        assert status_of(watched, "GET", "/ping") == 503
        # The stall the issue reproduces is long: many probes fail in a row (never restarted
        # here: SEMIF_MAX_FAILED_PROBES is 1000).
        wait_for(
            lambda: (
                watched.call("GET", "/health", timeout=10).json()["llama_server"]["failed_probes"]
                >= 10
            ),
            60,
            "ten failed probes in a row",
        )
        assert status_of(watched, "GET", "/ping") == 503
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: status_of(watched, "GET", "/ping") == 200, 10, "/ping 200 after SIGCONT")
    assert watched.call("POST", "/v1/chat/completions", CHAT, timeout=30).status == 200
    health = watched.call("GET", "/health").json()["llama_server"]
    assert health["pid"] == pid and health["restarts"] == 0


def test_a_chat_on_a_stalled_llama_server_holds_no_decision_back(watched: ProxyProcess) -> None:
    """A chat streams when its llama-server stops (SIGSTOP). The chat holds its CPU turn until
    its last chunk, which does not come; a decision sent then waited for it until the chat's
    deadline (a 504 after 55 s here, where no restart comes) or the supervisor's restart (17 s
    with the defaults). Now it is answered once llama-server is counted unhealthy (two missed
    probes in a row: 0.2 s apart here, 2 s by default)."""
    pid = watched.call("GET", "/health").json()["llama_server"]["pid"]
    conn = http.client.HTTPConnection("127.0.0.1", watched.port, timeout=60)
    chat = {
        "messages": [{"role": "user", "content": "Count from 1 to 500, one number a line."}],
        "max_tokens": 600,
        "temperature": 0,
        "stream": True,
    }
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(chat), {"Content-Type": "application/json"}
    )
    stream = conn.getresponse()
    assert stream.status == 200
    assert stream.read(6) == b"data: "  # the first event came: the chat holds its turn
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        decision = watched.call("POST", "/v1/decisions", {"decision": ROUTING}, timeout=70)
        waited = time.monotonic() - start
        assert decision.status == 200, decision.body[:300]
        assert waited < 15, waited
        assert watched.call("GET", "/health").json()["cpu"]["stalled_chat_passes"] >= 1
    finally:
        os.kill(pid, signal.SIGCONT)
        conn.close()  # the client hangs up: the proxy stops the generation
    wait_for(lambda: status_of(watched, "GET", "/ping") == 200, 10, "/ping 200 after SIGCONT")
    assert watched.call("POST", "/v1/chat/completions", CHAT, timeout=30).status == 200


def test_a_llama_server_that_stays_stalled_is_restarted(model_path: Path, tmp_path: Path) -> None:
    env = {**WATCH, "SEMIF_MAX_FAILED_PROBES": "3", "SEMIF_CHAT": "on"}
    server = ProxyProcess(model_path, env, log_path=tmp_path / "stalled.log").start()
    try:
        pid = server.call("GET", "/health").json()["llama_server"]["pid"]
        os.kill(pid, signal.SIGSTOP)
        wait_for(
            lambda: (
                server.call("GET", "/health", timeout=10).json()["llama_server"]["restarts"] == 1
            ),
            60,
            "a restart of the stalled llama-server",
        )
        wait_for(lambda: status_of(server, "GET", "/ping") == 200, 60, "/ping 200 again")
        health = server.call("GET", "/health").json()["llama_server"]
        assert health["unresponsive_kills"] == 1 and health["pid"] != pid
        assert server.call("POST", "/v1/chat/completions", CHAT, timeout=30).status == 200
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        events = [json.loads(li).get("event") for li in server.log_lines()]
        assert "llama_server_killed" in events
    finally:
        assert server.stop() == 0


def test_ping_is_503_while_decisions_are_refused(
    tiny_merging_model: Path, start_app: StartApp
) -> None:
    """/ping is 200 only when every path the server was started with can answer: a model whose
    answer letters are not single tokens cannot serve decisions, so /ping says 503 and why."""
    server = start_app(tiny_merging_model, {"SEMIF_CHAT": "off"}, launch=True)
    try:

        def refusing() -> bool:
            try:
                ping = server.call("GET", "/ping", timeout=5).json()
            except OSError:
                return False  # the port is not open yet
            return ping["engine"]["state"] == "refusing"

        wait_for(refusing, 60, "the engine to refuse")
        ping = server.call("GET", "/ping")
        assert ping.status == 503 and "does not tokenize" in ping.json()["engine"]["reason"]
        decision = server.call("POST", "/v1/decisions", {"decision": ROUTING})
        assert decision.status == 503
    finally:
        server.stop()


# -- bounded work -----------------------------------------------------------------------------


def hang_up_once_running(server: ProxyProcess, body: dict) -> None:
    """Send a decision, and hang up once the engine is working on a job (this one, or the one
    it queues behind)."""
    raw = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/decisions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw
        )
        wait_for(lambda: server.metric("semif_engine_job_running") == 1, 60, "an engine job")


def stopped_jobs(server: ProxyProcess) -> list[float]:
    """For each aborted engine job: seconds from the abort to the job's end."""
    events = [json.loads(li) for li in server.log_lines()]
    return [e["after_abort_seconds"] for e in events if e.get("event") == "engine_job_stopped"]


# Tokens a 3,800-token prefill has evaluated when it is stopped: its first ubatches (256 tokens
# each on the CPU, SEMIF_UBATCH_SIZE); a prefill that ran to its end counts all of them
# (engine.cpp counts a ubatch once it is decoded).
UNFINISHED_PREFILL = 3000


def test_a_client_that_hangs_up_stops_its_prefill(watched: ProxyProcess) -> None:
    body = {"decision": {**ROUTING, "id": "long", "state": long_state(3800)}}
    before = len(stopped_jobs(watched))
    tokens = watched.metric("semif_engine_tokens_evaluated_total")
    hang_up_once_running(watched, body)
    wait_for(lambda: len(stopped_jobs(watched)) > before, 60, "the engine job to stop")
    # It stopped at a graph node of its prefill, not at the end of it, so the next request
    # starts at once.
    assert watched.metric("semif_engine_tokens_evaluated_total") - tokens < UNFINISHED_PREFILL
    assert watched.metric("semif_engine_job_running") == 0
    reply = watched.call("POST", "/v1/decisions", {"decision": ROUTING}, timeout=60)
    assert reply.status == 200


def test_deadline_stops_the_work_and_says_why(model_path: Path, tmp_path: Path) -> None:
    env = {"SEMIF_CHAT": "off", "SEMIF_REQUEST_TIMEOUT": "3"}
    server = ProxyProcess(model_path, env, log_path=tmp_path / "deadline.log").start()
    try:
        body = {"decision": {**ROUTING, "id": "long", "state": long_state(3800)}}
        tokens = server.metric("semif_engine_tokens_evaluated_total")
        reply = server.call("POST", "/v1/decisions", body, timeout=60)
        assert reply.status == 504, reply.body
        message = reply.json()["error"]["message"]
        assert "SEMIF_REQUEST_TIMEOUT" in message and "60 s" in message
        wait_for(lambda: len(stopped_jobs(server)) == 1, 60, "the aborted job to stop")
        # Answered at the deadline and the work stopped there, before its prefill ended.
        assert server.metric("semif_engine_tokens_evaluated_total") - tokens < UNFINISHED_PREFILL
        assert server.metric("semif_engine_jobs_aborted_total") == 1
        assert server.call("POST", "/v1/decisions", {"decision": ROUTING}).status == 200
    finally:
        assert server.stop() == 0


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):  # peak resident set
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def worst_bodies(limit: int) -> Iterator[tuple[str, str, dict]]:
    """Bodies just under the size limit that would build the most prompts."""
    criteria = {f"label_{i}": "a fairly long description of this label " * 3 for i in range(26)}
    question = {"type": "choice", "instructions": "Pick the best label.", "criteria": criteria}
    one = len(json.dumps(question)) + 12
    questions = {f"q{i}": question for i in range(24)}
    state = "x" * (limit - 24 * one - 400)
    yield (
        "systemone",
        "/v1/systemone",
        {"model": "jev-latest", "state": state, "questions": questions, "permutations": 26},
    )
    # Just under what the longest-token bound refuses unread (81 bytes a token on SmolLM2):
    # the tokenizer must read this one, in its slowest case (one endless word).
    yield (
        "systemone-tokenized-state",
        "/v1/systemone",
        {"model": "jev-latest", "state": "x" * (4096 * 81 - 200), "questions": questions},
    )
    yield (
        "systemone-many-questions",
        "/v1/systemone",
        {
            "model": "jev-latest",
            "state": "short state",
            # As many as fit, up to the most SEMIF_MAX_QUESTIONS allows (the test sets 1000),
            # so that the token budget, not the count, refuses it.
            "questions": {f"q{i}": question for i in range(min(1000, limit // (one + 8) - 1))},
            "permutations": 26,
        },
    )
    options = [{"id": f"o{i}", "description": "words " * 40} for i in range(26)]
    decision = {"id": "d", "state": "y" * 30_000, "question": "Which?", "options": options}
    n = limit // (len(json.dumps(decision)) + 40)
    yield (
        "decisions",
        "/v1/decisions",
        {"decisions": [{**decision, "id": f"d{i}", "permutations": 26} for i in range(n)]},
    )


def test_the_largest_bodies_are_refused_before_any_prompt_is_built(
    model_path: Path, tmp_path: Path
) -> None:
    limit = DEFAULT_MAX_BODY_BYTES
    env = {"SEMIF_CHAT": "off", "SEMIF_MAX_DECISIONS": "1000", "SEMIF_MAX_QUESTIONS": "1000"}
    server = ProxyProcess(model_path, env, log_path=tmp_path / "worst.log").start()
    try:
        assert server.proc is not None
        peak_before = rss_kb(server.proc.pid)
        for name, path, body in worst_bodies(limit):
            raw = json.dumps(body).encode()
            assert len(raw) <= limit, (name, len(raw))
            started = time.monotonic()
            reply = server.call("POST", path, raw=raw, timeout=60)
            took = time.monotonic() - started
            assert reply.status in (413, 422), (name, reply.status, reply.body[:300])
            # Building every prompt of one of these takes minutes here (hundreds of 1 MiB
            # prompts); the refusal comes first (well under a second on an idle machine).
            assert took < 10.0, (name, took)
        # Nor was any of those prompts held in memory: the peak barely moved.
        assert rss_kb(server.proc.pid) - peak_before < 200 * 1024
    finally:
        server.stop()


def nested(depth: int) -> bytes:
    return b'{"decision": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize("depth", [65, 5000, 200_000])
def test_deeply_nested_bodies_are_a_400(watched: ProxyProcess, depth: int) -> None:
    for path in ("/v1/decisions", "/invocations", "/v1/systemone"):
        reply = watched.call("POST", path, raw=nested(depth))
        assert reply.status == 400, (path, reply.status, reply.body[:200])
        assert reply.json()["error"]["field"] == "body"
        assert "nested deeper than 64" in reply.json()["error"]["message"]
    assert status_of(watched, "GET", "/ping") == 200


def test_concurrent_hangups_leave_the_engine_usable(watched: ProxyProcess) -> None:
    body = {"decision": {**ROUTING, "id": "long", "state": long_state(1500)}}
    threads = [
        threading.Thread(target=hang_up_once_running, args=(watched, body)) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    reply: Reply = watched.call("POST", "/v1/decisions", {"decision": ROUTING}, timeout=60)
    assert reply.status == 200 and reply.json()["result"]["id"] == "route-1"
    assert resource.getrlimit(resource.RLIMIT_NOFILE)  # the process is alive and answering
