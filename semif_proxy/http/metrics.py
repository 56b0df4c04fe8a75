"""The Prometheus metrics of one application, on prometheus_client.

Each application has its own CollectorRegistry (never the process-wide one: tests build several
apps in one process, and one app's series must not show up in another's /metrics). Request
counters and latency histograms are updated as requests end; what other parts of the server
already count (engine tokens, cache hits, restarts, queue depths) is read through callbacks when
/metrics is scraped. Every label value comes from a fixed set, whatever a client sends: a
method outside METHODS is `other`, a route outside the app's own routes and the llama-server
paths it forwards is `other`, a status is its class (`2xx`...). docs/operations-metrics.md
lists the series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# No `<name>_created` series next to every counter and histogram: nothing here reads them and
# they double the counters' lines (process-wide in prometheus_client; this process is ours).
disable_created_metrics()

CONTENT_TYPE = CONTENT_TYPE_LATEST
OTHER = "other"
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"})
QUEUES = frozenset({"decision", "chat"})
# aiohttp's canonical name of the catch-all route ("/{tail:.*}") that forwards to llama-server.
CATCH_ALL = "/{tail}"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
QUEUE_BUCKETS = (0.001, *LATENCY_BUCKETS)


def method_label(method: str) -> str:
    return method if method in METHODS else OTHER


def status_label(status: int) -> str:
    """The status class: 2xx, 4xx... (499, a client that went away, is 4xx)."""
    return f"{status // 100}xx" if 100 <= status <= 599 else OTHER


class _Callbacks:
    """Series read when /metrics is scraped: (kind, name, help, fn) with fn() the value now.
    A counter's fn must only grow (a count kept elsewhere: engine tokens, restarts...)."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[str, str, Callable[[], float]]] = {}

    @staticmethod
    def _family(kind: str, name: str, doc: str) -> Metric:
        cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        return cls(name, doc)

    def describe(self) -> Iterator[Metric]:
        for name, (kind, doc, _) in self.items.items():
            yield self._family(kind, name, doc)

    def collect(self) -> Iterable[Metric]:
        for name, (kind, doc, fn) in sorted(self.items.items()):
            family = self._family(kind, name, doc)
            family.add_metric([], float(fn()))
            yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # The label sets for routes, filled in at start-up (health.register_gauges): the app's
        # own routes (their canonical names), and the llama-server paths the catch-all route
        # forwards; `chat_routes` are those where a time to first token is measured.
        self.own_routes: frozenset[str] = frozenset()
        self.forwarded: frozenset[str] = frozenset()
        self.chat_routes: frozenset[str] = frozenset()
        self.normalise: Callable[[str], str] = str.lower
        r = self.registry
        self.requests = Counter(
            "semif_requests_total",
            "HTTP requests by route, method and status class.",
            ["route", "method", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "semif_request_seconds",
            "HTTP request latency, arrival to the last byte handed to the socket.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "semif_in_flight_requests", "HTTP requests being answered now.", registry=r
        )
        self.decision_seconds = Histogram(
            "semif_decision_seconds",
            "Arrival to answer of the requests the decision engine answered (queue included).",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.time_to_first_token = Histogram(
            "semif_chat_time_to_first_token_seconds",
            "Arrival to llama-server's first chunk of a chat or completion answer (stream=false: "
            "the whole answer comes as one chunk).",
            ["route", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "semif_queue_wait_seconds",
            "Time a request waited in an admission queue for a running place.",
            ["queue"],
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.input_tokens = Counter(
            "semif_input_tokens_total",
            "Prompt tokens of the requests the decision engine answered.",
            ["route"],
            registry=r,
        )
        self._callbacks = _Callbacks()
        r.register(self._callbacks)  # type: ignore[arg-type]

    # -- labels -----------------------------------------------------------------------------

    def route_label(self, canonical: str | None, raw_path: str) -> str:
        """The route of a request, from a fixed set: the canonical name of the app's route it
        matched, or for the catch-all route the llama-server path it forwards to; else other."""
        if canonical is None:
            return OTHER
        if canonical == CATCH_ALL:
            path = self.normalise(raw_path)
            return path if path in self.forwarded else OTHER
        return canonical if canonical in self.own_routes else OTHER

    def queue_label(self, name: str) -> str:
        return name if name in QUEUES else OTHER

    # -- observations -----------------------------------------------------------------------

    def observe_request(
        self,
        route: str,
        method: str,
        status: int,
        seconds: float,
        tokens: int | None = None,
    ) -> None:
        """One finished request; `route` is already a label (route_label). `tokens`: the prompt
        tokens of a decision-engine answer, None for anything else."""
        self.requests.labels(route, method_label(method), status_label(status)).inc()
        self.request_seconds.labels(route).observe(seconds)
        if tokens is not None:
            self.decision_seconds.labels(route).observe(seconds)
            self.input_tokens.labels(route).inc(tokens)

    def first_chunk(self, route: str, stream: bool, seconds: float) -> None:
        if route in self.chat_routes:
            self.time_to_first_token.labels(route, "true" if stream else "false").observe(seconds)

    def queue_waited(self, queue: str) -> Callable[[float], None]:
        """What an Admission calls with each wait (admission.Admission.on_wait)."""
        return self.queue_wait.labels(self.queue_label(queue)).observe

    def gauge(self, name: str, fn: Callable[[], float], doc: str = "") -> None:
        """A gauge read when /metrics is scraped."""
        self._callbacks.items[name] = ("gauge", doc or name, fn)

    def counter(self, name: str, fn: Callable[[], float], doc: str = "") -> None:
        """A counter kept elsewhere, read when /metrics is scraped; its name ends in _total."""
        if not name.endswith("_total"):
            raise ValueError(f"counter {name!r}: Prometheus counters end in _total")
        self._callbacks.items[name] = ("counter", doc or name, fn)

    def render(self) -> bytes:
        """The text exposition format, as CONTENT_TYPE says."""
        return generate_latest(self.registry)
