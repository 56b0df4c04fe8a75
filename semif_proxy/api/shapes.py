"""Which API an /invocations body is for: SageMaker has one route, so the body's keys say."""

from __future__ import annotations

import json
from typing import Any

from semif_proxy.errors import InvalidRequest

ACCEPTED = (
    '{"messages": [...]} (chat), {"decision": {...}} or {"decisions": [...]} (decisions), '
    '{"state": ..., "questions": {...}} (System One)'
)


def request_shape(body: dict[str, Any]) -> str | None:
    """The API a body is for: "chat", "decisions", "systemone" or None."""
    if "messages" in body:
        return "chat"
    if "decision" in body or "decisions" in body:
        return "decisions"
    if "state" in body and "questions" in body:
        return "systemone"
    return None


def unrecognised(body: dict[str, Any]) -> InvalidRequest:
    keys = sorted(body)[:10]
    return InvalidRequest(
        f"unrecognised body (top-level keys {json.dumps(keys)}); accepted shapes: {ACCEPTED}",
        field="body",
    )
