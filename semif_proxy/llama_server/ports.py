"""Where the llama-servers listen on loopback: inside SageMaker's SAGEMAKER_SAFE_PORT_RANGE when
the container runs in an inference pipeline, never on the proxy's own port, and the second
llama-server of CPU sharing "dynamic" next to the first."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class PortError(ValueError):
    """A port setting that cannot work; the message names the variable."""


def safe_port_range(env: Mapping[str, str]) -> range | None:
    """In an inference pipeline SageMaker gives the container SAGEMAKER_SAFE_PORT_RANGE
    ("low-high") for any port of its own: the llama-servers' loopback ports go there."""
    text = env.get("SAGEMAKER_SAFE_PORT_RANGE", "").strip()
    if not text:
        return None
    low, sep, high = text.partition("-")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        raise PortError(
            f"SAGEMAKER_SAFE_PORT_RANGE: expected LOW-HIGH port numbers, got {text!r}"
        ) from None
    if not sep or not 1 <= lo <= hi <= 65535:
        raise PortError(f"SAGEMAKER_SAFE_PORT_RANGE: expected LOW-HIGH, got {text!r}")
    return range(lo, hi + 1)


def safe_upstream_port(allowed: range, public: Any) -> int:
    free = [port for port in allowed if str(port) != str(public)]
    for port in free:
        if port + 1 in free:  # CPU sharing "dynamic" puts its second llama-server on the next
            return port
    if free:
        return free[0]
    raise PortError(
        f"SAGEMAKER_SAFE_PORT_RANGE: {allowed.start}-{allowed.stop - 1} leaves no port "
        f"beside {public}"
    )


def second_port(upstream: int, public: int, allowed: range | None) -> int | None:
    """The second llama-server's port (CPU sharing "dynamic"): next to the first one, never
    the proxy's own, inside SageMaker's safe range when one is given. None: no such port (the
    plan falls back to the gate)."""
    for port in (upstream + 1, upstream + 2, upstream - 1):
        inside = allowed is None or port in allowed
        if 1 <= port <= 65535 and port not in (public, upstream) and inside:
            return port
    return None
