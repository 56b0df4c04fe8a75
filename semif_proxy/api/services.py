"""The one registry of decision services. Every caller that answers a decision or System One
body (`POST /invocations`, a JSON Lines line, eval's in-process target, `semif-proxy decide`)
finds its service here by the body's shape (`find`), and every service has the same shape:

- `plan(body, settings, sha256)` validates the body and builds its engine questions (off the
  engine thread; a 4xx `ApiError` for bad input);
- `answer(engine, planned)` runs it on the engine thread and returns an `Answered` (the
  response body and the prompt tokens it counted);
- `state(planned)` is the state the request asks about (JSON Lines groups lines by it).

Chat is no service here: the HTTP layer forwards it to llama-server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from semif_proxy.api import decisions, systemone
from semif_proxy.errors import InvalidRequest

if TYPE_CHECKING:
    from semif_proxy.engine.worker import DecisionEngine
    from semif_proxy.settings import Settings


@dataclass(frozen=True)
class Answered:
    """A service's answer: the response body, and the prompt tokens it counted (the access
    log's `tokens`, System One's `usage.input_tokens`)."""

    body: dict[str, Any]
    input_tokens: int


class Service(Protocol):
    name: str

    def plan(self, body: dict[str, Any], settings: Settings, sha256: str) -> Any: ...

    def answer(self, engine: DecisionEngine, planned: Any) -> Answered: ...

    def state(self, planned: Any) -> Any: ...


@dataclass(frozen=True)
class Decisions:
    """`{"decision": ...}` and `{"decisions": [...]}`. `limited=False` (the command line)
    checks only the API's own limits, not the server's SEMIF_MAX_DECISIONS/_OPTIONS."""

    limited: bool = True
    name: str = "decisions"

    def plan(
        self, body: dict[str, Any], settings: Settings, sha256: str
    ) -> decisions.DecisionRequest:
        defaults = {
            "default_readout": settings.readout.for_type("decision"),
            "default_bias": settings.bias_correction.for_type("decision"),
        }
        if not self.limited:
            return decisions.parse_request(body, **defaults)
        return decisions.parse_request(
            body, settings.max_decisions, settings.max_options, **defaults
        )

    def answer(self, engine: DecisionEngine, planned: decisions.DecisionRequest) -> Answered:
        body, tokens = decisions.answer(engine, planned)
        return Answered(body, tokens)

    def state(self, planned: decisions.DecisionRequest) -> Any:
        return planned.decisions[0].state


@dataclass(frozen=True)
class SystemOne:
    """TypeSafe's System One request (`{"model", "state", "questions"}`)."""

    name: str = "systemone"

    def plan(self, body: dict[str, Any], settings: Settings, sha256: str) -> systemone.Plan:
        return systemone.plan(body, settings, sha256)

    def answer(self, engine: DecisionEngine, planned: systemone.Plan) -> Answered:
        body = systemone.answer(engine, planned, strict=engine.settings.strict)
        return Answered(body, body["usage"]["input_tokens"])

    def state(self, planned: systemone.Plan) -> Any:
        return planned.request.state


SERVICES: dict[str, Service] = {"decisions": Decisions(), "systemone": SystemOne()}


# SageMaker has one route, so an /invocations body's keys say which API it is for.
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


def find(body: dict[str, Any]) -> Service | None:
    """The service a body is for; None for chat (the HTTP layer forwards it to llama-server);
    a 400 naming the accepted shapes for any other body."""
    shape = request_shape(body)
    if shape == "chat":
        return None
    if shape is None:
        keys = sorted(body)[:10]
        raise InvalidRequest(
            f"unrecognised body (top-level keys {json.dumps(keys)}); accepted shapes: {ACCEPTED}",
            field="body",
        )
    return SERVICES[shape]
