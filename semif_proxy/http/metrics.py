"""A small Prometheus text-format registry (counters, gauges, histograms)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
Labels = tuple[tuple[str, str], ...]


def _fmt_labels(labels: Labels, extra: tuple[tuple[str, str], ...] = ()) -> str:
    items = labels + extra
    if not items:
        return ""
    body = ",".join(f'{k}="{v}"' for k, v in items)
    return "{" + body + "}"


class Metrics:
    def __init__(self) -> None:
        self.requests: dict[Labels, int] = defaultdict(int)
        self.latency_counts: dict[Labels, list[int]] = {}
        self.latency_sum: dict[Labels, float] = defaultdict(float)
        self.in_flight = 0
        self.gauges: dict[str, Callable[[], float]] = {}

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (("route", route), ("method", method), ("status", str(status)))
        self.requests[key] += 1
        lkey = (("route", route),)
        counts = self.latency_counts.setdefault(lkey, [0] * (len(LATENCY_BUCKETS) + 1))
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                counts[i] += 1
        counts[-1] += 1
        self.latency_sum[lkey] += seconds

    def gauge(self, name: str, fn: Callable[[], float]) -> None:
        self.gauges[name] = fn

    def render(self) -> str:
        lines = [
            "# HELP semif_requests_total HTTP requests by route, method and status.",
            "# TYPE semif_requests_total counter",
        ]
        for labels, value in sorted(self.requests.items()):
            lines.append(f"semif_requests_total{_fmt_labels(labels)} {value}")
        lines += [
            "# HELP semif_request_seconds HTTP request latency.",
            "# TYPE semif_request_seconds histogram",
        ]
        for labels, counts in sorted(self.latency_counts.items()):
            for bound, count in zip(LATENCY_BUCKETS, counts):
                lines.append(
                    "semif_request_seconds_bucket"
                    f"{_fmt_labels(labels, (('le', str(bound)),))} {count}"
                )
            lines.append(
                f"semif_request_seconds_bucket{_fmt_labels(labels, (('le', '+Inf'),))} {counts[-1]}"
            )
            lines.append(
                f"semif_request_seconds_sum{_fmt_labels(labels)} {self.latency_sum[labels]}"
            )
            lines.append(f"semif_request_seconds_count{_fmt_labels(labels)} {counts[-1]}")
        lines += [
            "# TYPE semif_in_flight_requests gauge",
            f"semif_in_flight_requests {self.in_flight}",
        ]
        for name, fn in sorted(self.gauges.items()):
            lines.append(f"# TYPE {name} gauge")
            lines.append(f"{name} {fn()}")
        return "\n".join(lines) + "\n"
