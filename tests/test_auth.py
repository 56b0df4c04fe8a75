"""The API key, the upstream allow-list and secrets in logs, against the real proxy (with its real
llama-server): its listening sockets, its log and its child's argv are what some of these tests
read; the admin routes and SageMaker's open /invocations, against the app in this process (with
its real llama-server). Requests go out byte for byte (http.client sends the target as given),
so the proxy sees exactly the odd spellings a client could send."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from semif_proxy.http.auth import is_public, normalise_path
from semif_proxy.testing.server import ProxyProcess, wait_for
from tests.helpers.app_server import AppServer

KEY = "s3cr3t-xyz"
UPSTREAM_KEY = "upstream-k3y"
HF_TOKEN = "hf-t0ken-abcdef"
SECRETS = (KEY, UPSTREAM_KEY, HF_TOKEN)


@pytest.fixture(scope="module")
def keyed(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    log = tmp_path_factory.mktemp("auth") / "proxy.log"
    server = ProxyProcess(
        model_path,
        {
            "SEMIF_API_KEY": KEY,
            # Never forwarded: llama-server stays keyless on loopback, behind the proxy's key.
            "SM_LLAMA_CPP_API_KEY": UPSTREAM_KEY,
            "SM_LLAMA_CPP_HF_TOKEN": HF_TOKEN,  # forwarded (--hf-token), but never logged
            "SM_LLAMA_CPP_HOST": "0.0.0.0",  # ignored: llama-server stays on 127.0.0.1
            "SEMIF_HOST": None,  # the default: `semif-proxy serve` listens on loopback only
        },
        log_path=log,
    ).start()
    server.log_path = log
    yield server
    server.stop()


def send(
    server: ProxyProcess,
    method: str,
    target: str,
    key: str | None = None,
    body: Any = None,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, target, body=data, headers=headers)
        reply = conn.getresponse()
        return reply.status, dict(reply.headers), reply.read()
    finally:
        conn.close()


NOTHING = {"nothing": 1}
COMPLETION = {"prompt": "Hello", "n_predict": 1}
# (method, raw target, body, status without the key, status with it). A wrong key is no key.
CASES = [
    # Public by design, only in their plain spelling.
    ("GET", "/ping", None, 200, 200),
    ("GET", "/ping?probe=1", None, 200, 200),
    # Not public off SageMaker (`semif-proxy serve`): compute, behind the key like /v1/*.
    ("POST", "/invocations", NOTHING, 401, 400),
    ("GET", "/", None, 200, 200),
    ("GET", "/playground", None, 200, 200),
    ("GET", "/playground/app.js", None, 200, 200),
    # Odd spellings of public paths need the key (and are then routed as aiohttp routes them).
    ("GET", "/PING", None, 401, 404),
    ("GET", "//ping", None, 401, 404),
    ("GET", "/ping/", None, 401, 404),
    ("GET", "/p%69ng", None, 401, 200),  # aiohttp decodes it to /ping
    ("GET", "/./ping", None, 401, 404),
    ("GET", "/%2e%2e/ping", None, 401, 404),
    ("GET", "/ping/../v1/models", None, 401, 404),
    ("GET", "/ping/../health", None, 401, 200),  # llama-server's /health, normalised
    ("GET", "/playground/../health", None, 401, 200),
    ("GET", "/Playground", None, 401, 404),
    ("POST", "/INVOCATIONS", NOTHING, 401, 404),
    ("POST", "//invocations", NOTHING, 401, 404),
    ("POST", "/invocations/", NOTHING, 401, 404),
    ("POST", "/invocations/../v1/decisions", NOTHING, 401, 404),
    # Ours, not public: they show versions, pids and traffic.
    ("GET", "/health", None, 401, 200),
    ("GET", "/metrics", None, 401, 200),
    ("GET", "/v1/models", None, 401, 200),
    ("POST", "/v1/decisions", NOTHING, 401, 400),
    ("GET", "/V1/MODELS", None, 401, 404),
    ("GET", "//v1/models", None, 401, 404),
    ("GET", "/v1%2Fmodels", None, 401, 404),
    # llama-server's routes: the allow-list, behind the key.
    ("POST", "/completion", COMPLETION, 401, 200),
    ("POST", "/tokenize", {"content": "hi"}, 401, 200),
    ("GET", "/props", None, 401, 200),
    ("GET", "/models", None, 401, 200),
    # Its admin routes are off by default, however they are spelled.
    ("POST", "/props", {}, 401, 404),
    ("GET", "/slots", None, 401, 404),
    ("GET", "//slots", None, 401, 404),
    ("GET", "/SLOTS", None, 401, 404),
    ("GET", "/%73lots", None, 401, 404),
    ("GET", "/%2573lots", None, 401, 404),
    ("POST", "/slots/0?action=erase", {}, 401, 404),
    ("GET", "/lora-adapters", None, 401, 404),
    ("GET", "/nope", None, 401, 404),
]


@pytest.mark.parametrize(("method", "target", "body", "without", "with_key"), CASES)
def test_raw_paths_and_the_key(
    keyed: ProxyProcess, method: str, target: str, body: Any, without: int, with_key: int
) -> None:
    for key, expected in (
        (None, without),
        ("wrong", without),
        (UPSTREAM_KEY, without),  # llama-server's would-be key is not the proxy's
        (KEY, with_key),
    ):
        status, _, payload = send(keyed, method, target, key, body)
        assert status == expected, (key, payload[:300])
        if status == 401:
            assert json.loads(payload)["error"]["field"] == "Authorization"


def test_unauthorized_answer(keyed: ProxyProcess) -> None:
    status, headers, payload = send(keyed, "POST", "/completion", body=COMPLETION)
    assert status == 401 and headers["Content-Type"].startswith("application/json")
    error = json.loads(payload)["error"]
    assert error["type"] == "unauthorized" and error["field"] == "Authorization"
    assert error["request_id"] and headers["WWW-Authenticate"].startswith("Bearer")
    # The scheme is case-insensitive (RFC 7235); the key is not.
    conn = http.client.HTTPConnection("127.0.0.1", keyed.port, timeout=60)
    try:
        conn.request("GET", "/health", headers={"Authorization": f"bearer {KEY}"})
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    assert send(keyed, "GET", "/health", KEY.upper())[0] == 401


DECISION = {
    "decision": {
        "id": "d1",
        "state": "I was charged twice for my order.",
        "question": "Which team should handle this?",
        "options": [
            {"id": "billing", "description": "Billing and refunds"},
            {"id": "shipping", "description": "Delivery problems"},
        ],
    }
}
CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 2}


def invoke(server: ProxyProcess, body: Any, key: str | None, lines: bool = False) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    if lines:  # a Batch Transform call: JSON Lines
        raw = (json.dumps(body) + "\n").encode()
        headers["Content-Type"] = "application/jsonlines"
        return server.call("POST", "/invocations", raw=raw, headers=headers)
    return server.call("POST", "/invocations", body, headers)


def test_invocations_needs_the_key_off_sagemaker(keyed: ProxyProcess) -> None:
    """`semif-proxy serve` with a key: /invocations is compute like any route, whatever the
    body asks for (SageMaker's key-free /invocations is the image entrypoint's: test_sagemaker)."""
    for body, lines in ((DECISION, False), (CHAT, False), (DECISION, True)):
        for key in (None, "wrong", UPSTREAM_KEY):
            reply = invoke(keyed, body, key, lines)
            assert reply.status == 401, (body, lines, key, reply.body[:300])
            assert reply.json()["error"]["field"] == "Authorization"
            assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    decided = invoke(keyed, DECISION, KEY)
    assert decided.status == 200 and decided.json()["result"]["id"] == "d1", decided.body[:300]
    assert invoke(keyed, CHAT, KEY).status == 200
    batch = invoke(keyed, DECISION, KEY, lines=True)
    assert batch.status == 200 and json.loads(batch.body)["result"]["id"] == "d1"


def test_serve_listens_on_loopback_and_says_so(keyed: ProxyProcess) -> None:
    assert keyed.proc is not None
    assert _listening(keyed.proc.pid) == [("127.0.0.1", keyed.port)]
    [line] = [li for li in map(json.loads, keyed.log_lines()) if li.get("event") == "listening"]
    assert (line["host"], line["port"]) == ("127.0.0.1", keyed.port)
    assert line["api_key_set"] is True and line["invocations_public"] is False
    assert f"http://127.0.0.1:{keyed.port}" in line["msg"]


def test_chat_with_the_key_reaches_a_keyless_llama_server(keyed: ProxyProcess) -> None:
    chat = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}
    status, _, payload = send(keyed, "POST", "/v1/chat/completions", KEY, chat)
    assert status == 200, payload
    assert json.loads(payload)["choices"][0]["message"]["role"] == "assistant"
    status, _, payload = send(keyed, "POST", "/completion", KEY, COMPLETION)
    assert status == 200 and "content" in json.loads(payload)


def test_unknown_path_is_our_404_naming_it(keyed: ProxyProcess) -> None:
    status, _, payload = send(keyed, "GET", "/slots?fields=all", KEY)
    error = json.loads(payload)["error"]
    assert status == 404 and error["type"] == "not_found" and error["field"] == "path"
    assert "/slots" in error["message"]


def _listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of the TCP sockets the process listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink()
        except OSError:
            continue
        found = re.fullmatch(r"socket:\[(\d+)\]", str(target))
        if found:
            inodes.add(found.group(1))
    sockets = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            address, port = local.split(":")
            assert len(address) == width
            if width == 8:
                ip = ".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0))
            else:
                ip = "ipv6:" + address
            sockets.append((ip, int(port, 16)))
    return sockets


def test_llama_server_stays_on_loopback(keyed: ProxyProcess) -> None:
    health = json.loads(send(keyed, "GET", "/health", KEY)[2])
    servers = [("llama_server", keyed.upstream_port)]
    if health["cpu"]["sharing"] == "dynamic":  # the default on 2+ cores: a second one
        wait_for(
            lambda: json.loads(send(keyed, "GET", "/health", KEY)[2])["llama_server_split"][
                "healthy"
            ],
            120,
            "the second llama-server is up",
        )
        health = json.loads(send(keyed, "GET", "/health", KEY)[2])
        servers.append(("llama_server_split", keyed.upstream_port + 1))
    for key, port in servers:
        pid = health[key]["pid"]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        assert argv[argv.index("--host") + 1] == "127.0.0.1" and "0.0.0.0" not in argv
        assert "--api-key" not in argv and argv[argv.index("--hf-token") + 1] == HF_TOKEN
        listening = _listening(pid)
        assert listening == [("127.0.0.1", port)], (key, listening)
    log = keyed.log_path.read_text()
    assert re.search(r"SM_LLAMA_CPP_HOST is ignored: llama-server listens on 127\.0\.0\.1", log)


def test_secrets_never_reach_the_log(keyed: ProxyProcess) -> None:
    # Log lines that could carry them: a path with the key in it, wrong keys, chat.
    send(keyed, "GET", f"/{KEY}/{UPSTREAM_KEY}", KEY)
    send(keyed, "GET", f"/x?token={HF_TOKEN}", UPSTREAM_KEY)
    send(keyed, "POST", "/v1/chat/completions", KEY, {"messages": [], "max_tokens": 1})
    text = keyed.log_path.read_text()
    for secret in SECRETS:
        assert secret not in text
    lines = [json.loads(li) for li in text.splitlines() if li.startswith("{")]
    started = [li for li in lines if li.get("event") == "llama_server_start"]
    assert started  # one, or two with CPU sharing dynamic
    for line in started:
        argv = line["argv"]
        assert argv[argv.index("--hf-token") + 1] == "***"
    [settings] = [li["settings"] for li in lines if li.get("event") == "settings"]
    assert settings["api_key"] == "***"
    args = settings["llama_server_args"]
    assert args[args.index("--hf-token") + 1] == "***"
    assert any(li.get("path") == "/***/***" for li in lines)


@pytest.fixture(scope="module")
def admin(model_path: Path) -> Iterator[AppServer]:
    """Two settings on one server (each start costs seconds): llama-server's admin routes, and
    /invocations opened explicitly as SageMaker's entrypoint opens it."""
    env = {
        "SEMIF_API_KEY": KEY,
        "SEMIF_UPSTREAM_ADMIN": "on",
        "SEMIF_DECISIONS": "off",
        "SEMIF_INVOCATIONS_PUBLIC": "true",
    }
    server = AppServer(model_path, env, preset="full").start()
    yield server
    server.stop()


@pytest.mark.parametrize("target", ["/slots", "//slots", "/SLOTS", "/%73lots", "/slots/"])
def test_admin_routes_pass_only_when_turned_on(admin: ProxyProcess, target: str) -> None:
    assert send(admin, "GET", target)[0] == 401
    status, _, payload = send(admin, "GET", target, KEY)
    assert status == 200, payload
    slots = json.loads(payload)
    assert isinstance(slots, list) and slots and "id" in slots[0]  # llama-server's own answer


def test_admin_setting_keeps_other_paths_closed(admin: ProxyProcess) -> None:
    assert send(admin, "GET", "/nope", KEY)[0] == 404
    assert send(admin, "POST", "/slots/x", KEY, {})[0] == 404


def test_invocations_public_setting_opens_only_invocations(admin: ProxyProcess) -> None:
    reply = invoke(admin, CHAT, None)  # decisions are off here: chat is what it answers
    assert reply.status == 200, reply.body[:300]
    assert reply.json()["choices"][0]["message"]["role"] == "assistant"
    assert invoke(admin, CHAT, "wrong").status == 200  # no key of ours is read there
    # Only its plain spelling, and nothing else opens with it.
    assert send(admin, "POST", "/invocations/", body=CHAT)[0] == 401
    assert send(admin, "POST", "/v1/chat/completions", body=CHAT)[0] == 401
    assert send(admin, "GET", "/health")[0] == 401


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("/ping", "/ping"),
        ("/PING/", "/ping"),
        ("//v1//decisions?x=/ping", "/v1/decisions"),
        ("/p%69ng", "/ping"),
        ("/%252e%252e/%73lots", "/slots"),
        ("/a/./b/../../../slots", "/slots"),
        ("/v1%5Cdecisions", "/v1/decisions"),
    ],
)
def test_normalise_path(raw: str, normal: str) -> None:
    assert normalise_path(raw) == normal
    assert is_public("GET", raw, frozenset({("GET", normal)})) == (raw == normal)
