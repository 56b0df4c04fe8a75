"""GET /metrics (prometheus_client) after real requests: the counters move, the histograms have
buckets and counts, and no label value comes from what a client sent (method, path)."""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from semif_proxy.http.keys import METRICS
from semif_proxy.http.metrics import (
    LATENCY_BUCKETS,
    METHODS,
    Metrics,
    method_label,
    status_label,
)
from semif_proxy.http.routes import proxy as proxy_routes
from semif_proxy.testing.server import ProxyProcess, wait_for
from tests.conftest import engine_settings
from tests.helpers.app_client import settled_ping

DECISION = {
    "id": "m-1",
    "state": "Customer email: my parcel never arrived and the tracking page is blank.",
    "question": "Which support queue should handle this ticket?",
    "options": [
        {"id": "billing", "description": "Billing and refunds"},
        {"id": "shipping", "description": "Delivery and tracking"},
    ],
}
CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0}
STATUS_CLASSES = {"1xx", "2xx", "3xx", "4xx", "5xx", "other"}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def allowed_routes(model_path: Path) -> set[str]:
    """Every route label there may be: the app's own routes, the llama-server paths it
    forwards, and `other`."""
    from semif_proxy.http.app import create_app

    app = create_app(engine_settings(model_path))
    own = {r.canonical for r in app.router.resources()} - {"/{tail}"}
    forwarded = {p for _, p in proxy_routes.UPSTREAM_ROUTES | proxy_routes.ADMIN_ROUTES}
    return own | forwarded | {"other"}


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def raw_request(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def check_labels(families: Iterable[Any], routes: set[str]) -> None:
    for family in families:
        for s in family.samples:
            labels = s.labels
            if "method" in labels:
                assert labels["method"] in METHODS | {"other"}, s
            if "route" in labels:
                assert labels["route"] in routes, s
            if "status" in labels:
                assert labels["status"] in STATUS_CLASSES, s
            if "queue" in labels:
                assert labels["queue"] in {"decision", "chat", "other"}, s
            if "stream" in labels:
                assert labels["stream"] in {"true", "false"}, s


def test_metrics_after_real_requests(proxy: ProxyProcess, model_path: Path) -> None:
    before = samples(proxy.call("GET", "/metrics").body.decode())

    decision = proxy.call("POST", "/v1/decisions", {"decision": DECISION})
    assert decision.status == 200, decision.body[:300]
    assert proxy.call("POST", "/invocations", CHAT, timeout=60).status == 200
    chat = proxy.call("POST", "/v1/chat/completions", {**CHAT, "stream": True}, timeout=60)
    assert chat.status == 200 and b"data: " in chat.body
    assert proxy.call("GET", "/no/such/thing-zz9").status == 404
    # BREW is refused by aiohttp's parser (400, before any handler); PURGE, which it accepts,
    # reaches the app. Neither method nor path may become a label value.
    brew = raw_request(
        proxy.port, b"BREW /pot-zz9 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert brew.startswith(b"HTTP/1.") and b" 200 " not in brew.split(b"\r\n", 1)[0]
    purge = raw_request(
        proxy.port, b"PURGE /made/up-zz9 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert purge.split(b"\r\n", 1)[0].endswith(b"404 Not Found"), purge[:200]

    def scraped() -> Samples:
        return samples(proxy.call("GET", "/metrics").body.decode())

    def moved(name: str, by: float = 1, **labels: str) -> bool:
        return value(scraped(), name, **labels) - value(before, name, **labels) >= by

    # The counts are taken as each request ends, which a streamed answer may do just after
    # its last byte: wait for them rather than race them.
    checks = [
        ("semif_requests_total", {"route": "/v1/decisions", "method": "POST", "status": "2xx"}),
        (
            "semif_requests_total",
            {"route": "/v1/chat/completions", "method": "POST", "status": "2xx"},
        ),
        ("semif_requests_total", {"route": "/invocations", "method": "POST", "status": "2xx"}),
        ("semif_requests_total", {"route": "other", "method": "GET", "status": "4xx"}),
        ("semif_requests_total", {"route": "other", "method": "other", "status": "4xx"}),
        ("semif_decision_seconds_count", {"route": "/v1/decisions"}),
        ("semif_input_tokens_total", {"route": "/v1/decisions"}),
        ("semif_queue_wait_seconds_count", {"queue": "decision"}),
        ("semif_queue_wait_seconds_count", {"queue": "chat"}),
        (
            "semif_chat_time_to_first_token_seconds_count",
            {"route": "/v1/chat/completions", "stream": "true"},
        ),
        (
            "semif_chat_time_to_first_token_seconds_count",
            {"route": "/invocations", "stream": "false"},
        ),
    ]
    for name, labels in checks:
        wait_for(lambda n=name, lb=labels: moved(n, **lb), 30, f"{name}{labels} to move")

    reply = proxy.call("GET", "/metrics")
    assert reply.headers["Content-Type"] == prometheus_client.CONTENT_TYPE_LATEST
    text = reply.body.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    after = samples(text)
    assert value(after, "semif_input_tokens_total", route="/v1/decisions") > value(
        before, "semif_input_tokens_total", route="/v1/decisions"
    )

    # Histograms: a bucket per bound and +Inf, cumulative, +Inf equal to the count.
    for name, labels in [
        ("semif_request_seconds", {"route": "/v1/decisions"}),
        ("semif_decision_seconds", {"route": "/v1/decisions"}),
        (
            "semif_chat_time_to_first_token_seconds",
            {"route": "/v1/chat/completions", "stream": "true"},
        ),
        ("semif_queue_wait_seconds", {"queue": "decision"}),
    ]:
        assert families[name].type == "histogram", name
        buckets = sorted(
            (float(s.labels["le"]), s.value)
            for s in families[name].samples
            if s.name == name + "_bucket"
            and {k: v for k, v in s.labels.items() if k != "le"} == labels
        )
        assert len(buckets) >= len(LATENCY_BUCKETS) + 1 and math.isinf(buckets[-1][0]), name
        counts = [c for _, c in buckets]
        assert counts == sorted(counts), (name, buckets)
        count = value(after, name + "_count", **labels)
        assert count >= 1 and buckets[-1][1] == count, (name, buckets, count)
        assert value(after, name + "_sum", **labels) > 0, name

    # Kinds and names kept from the hand-written exposition.
    for name in (
        "semif_requests",
        "semif_engine_tokens_evaluated",
        "semif_engine_jobs_aborted",
        "semif_prefix_cache_hits",
        "semif_prefix_cache_misses",
        "semif_decision_rejected",
        "semif_chat_rejected",
        "semif_llama_server_restarts",
        "semif_llama_server_unresponsive_kills",
        "semif_cpu_gate_waits",
        "semif_input_tokens",
    ):
        assert families[name].type == "counter", name
        assert any(s.name == name + "_total" for s in families[name].samples), name
    for name in (
        "semif_in_flight_requests",
        "semif_engine_job_running",
        "semif_prefix_cache_bytes",
        "semif_decision_queue_depth",
        "semif_decision_running",
        "semif_chat_queue_depth",
        "semif_chat_running",
        "semif_cpu_gate_waiting",
    ):
        assert families[name].type == "gauge", name
    assert value(after, "semif_engine_tokens_evaluated_total") > 0
    assert proxy.metric("semif_in_flight_requests") >= 1  # the scrape itself

    # Labels from the fixed sets only: nothing of what the clients sent.
    check_labels(families.values(), allowed_routes(model_path))
    for sent in ("BREW", "PURGE", "zz9", "/no/such", "/made/up", "pot-"):
        assert sent not in text, sent


def test_labels_come_from_fixed_sets() -> None:
    assert [method_label(m) for m in ("GET", "PATCH", "BREW", "get", "PURGE")] == [
        "GET",
        "PATCH",
        "other",
        "other",
        "other",
    ]
    assert [status_label(s) for s in (200, 404, 499, 503, 42, 999)] == [
        "2xx",
        "4xx",
        "4xx",
        "5xx",
        "other",
        "other",
    ]
    metrics = Metrics()
    metrics.own_routes = frozenset({"/v1/decisions"})
    metrics.forwarded = frozenset({"/v1/chat/completions"})
    metrics.normalise = str.lower
    assert metrics.route_label("/v1/decisions", "/v1/decisions") == "/v1/decisions"
    assert metrics.route_label("/{tail}", "/V1/CHAT/COMPLETIONS") == "/v1/chat/completions"
    assert metrics.route_label("/{tail}", "/anything/else") == "other"
    assert metrics.route_label("/added-later", "/added-later") == "other"
    assert metrics.route_label(None, "/x") == "other"
    assert metrics.queue_label("decision") == "decision" and metrics.queue_label("x") == "other"
    with pytest.raises(ValueError, match="_total"):
        metrics.counter("semif_things", lambda: 1.0)


def test_each_app_has_its_own_registry(model_path: Path) -> None:
    """Two apps in one process (as the tests build them): one's requests never show in the
    other's /metrics, and nothing lands in prometheus_client's process-wide registry. With an
    API key set, the refused requests are counted with the same fixed labels."""
    from aiohttp.test_utils import TestClient, TestServer

    from semif_proxy.http.app import create_app

    key = {"Authorization": "Bearer k-zz9"}

    async def scenario() -> None:
        first_app = create_app(engine_settings(model_path, api_key="k-zz9"))
        second_app = create_app(engine_settings(model_path, api_key="k-zz9"))
        async with (
            TestClient(TestServer(first_app)) as first,
            TestClient(TestServer(second_app)) as second,
        ):
            await settled_ping(first)
            for _ in range(3):
                reply = await first.post("/v1/decisions", json={"decision": DECISION}, headers=key)
                assert reply.status == 200, await reply.text()
            refused = await first.request("PURGE", "/v1/decisions")  # no key: 401
            assert refused.status == 401
            unkeyed = await first.post("/v1/decisions", json={"decision": DECISION})
            assert unkeyed.status == 401
            one = (await (await first.get("/metrics", headers=key)).read()).decode()
            other = (await (await second.get("/metrics", headers=key)).read()).decode()
        found_one, found_other = samples(one), samples(other)
        ok = {"route": "/v1/decisions", "method": "POST", "status": "2xx"}
        assert value(found_one, "semif_requests_total", **ok) == 3
        assert value(found_other, "semif_requests_total", **ok) == 0
        assert value(found_one, "semif_decision_seconds_count", route="/v1/decisions") == 3
        assert value(found_other, "semif_decision_seconds_count", route="/v1/decisions") == 0
        unauth = {"route": "/v1/decisions", "method": "POST", "status": "4xx"}
        assert value(found_one, "semif_requests_total", **unauth) == 1
        # PURGE /v1/decisions is routed to the catch-all (no PURGE route): route other too.
        purge = {"route": "other", "method": "other", "status": "4xx"}
        assert value(found_one, "semif_requests_total", **purge) == 1
        assert "PURGE" not in one
        check_labels(text_string_to_metric_families(one), allowed_routes(model_path))
        assert first_app[METRICS].registry is not second_app[METRICS].registry

    asyncio.run(scenario())
    process_wide = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "semif_" not in process_wide
