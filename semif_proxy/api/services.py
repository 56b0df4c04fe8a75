"""The one registry of decision services. Every caller that answers a decision or System One
body (`POST /invocations`, a JSON Lines line, eval's in-process target, `semif-proxy decide`)
finds its service here by the body's shape (`find`), and every service has the same shape:

- `plan(body, settings, sha256)` validates the body and builds its engine questions (off the
  engine thread; a 4xx `ApiError` for bad input);
- `answer(engine, planned)` runs it on the engine thread and returns an `Answered` (the
  response body and the prompt tokens it counted);
- `evaluate(engine, planned)` and `render(engine, planned, evaluation)` are `answer` in two
  steps, for a caller that batch-corrects over several requests between them
  (`render_together`, for a JSON Lines body's lines); `answer` alone refuses a batch
  correction, since one request holds one state;
- `state(planned)` is the state the request asks about (JSON Lines groups lines by it).

Chat is no service here: the HTTP layer forwards it to llama-server.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from semif_proxy.api import decisions, systemone, systemone_schemas
from semif_proxy.engine import batch_bias
from semif_proxy.errors import ApiError, InvalidRequest, internal_error

if TYPE_CHECKING:
    from collections.abc import Sequence

    from semif_proxy.api.rotations import Rotated
    from semif_proxy.engine.questions import Evaluation, Question, Scored
    from semif_proxy.engine.worker import DecisionEngine
    from semif_proxy.settings import Settings


@dataclass(frozen=True)
class Answered:
    """A service's answer: the response body, and the prompt tokens it counted (the access
    log's `tokens`, System One's `usage.input_tokens`)."""

    body: dict[str, Any]
    input_tokens: int


@dataclass(frozen=True)
class Evaluated:
    """A request's engine rows before rendering: its questions in the orders asked, and the
    engine's evaluation (whose rows a batch correction may replace, `with_rows`)."""

    asked: list[Rotated]
    evaluation: Evaluation

    @property
    def rows(self) -> list[Scored]:
        return self.evaluation.scored

    def with_rows(self, rows: list[Scored]) -> Evaluated:
        return replace(self, evaluation=replace(self.evaluation, scored=rows))


class Service(Protocol):
    name: str

    def plan(self, body: dict[str, Any], settings: Settings, sha256: str) -> Any: ...

    def answer(self, engine: DecisionEngine, planned: Any) -> Answered: ...

    def evaluate(self, engine: DecisionEngine, planned: Any) -> Evaluated: ...

    def render(self, engine: DecisionEngine, planned: Any, evaluated: Evaluated) -> Answered: ...

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
            "default_normalization": settings.normalization.for_type("decision"),
        }
        if not self.limited:
            return decisions.parse_request(body, **defaults)
        return decisions.parse_request(
            body, settings.max_decisions, settings.max_options, **defaults
        )

    def answer(self, engine: DecisionEngine, planned: decisions.DecisionRequest) -> Answered:
        body, tokens = decisions.answer(engine, planned)
        return Answered(body, tokens)

    def evaluate(self, engine: DecisionEngine, planned: decisions.DecisionRequest) -> Evaluated:
        return Evaluated(*decisions.evaluate(engine, planned.decisions, planned.paths))

    def render(
        self, engine: DecisionEngine, planned: decisions.DecisionRequest, evaluated: Evaluated
    ) -> Answered:
        results = decisions.render(engine, planned.decisions, evaluated.asked, evaluated.evaluation)
        body = decisions.answer_body(planned, results, evaluated.evaluation.timing)
        return Answered(body, decisions.tokens_of(results))

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

    def evaluate(self, engine: DecisionEngine, planned: systemone.Plan) -> Evaluated:
        return Evaluated(planned.asked, systemone.evaluate(engine, planned))

    def render(
        self, engine: DecisionEngine, planned: systemone.Plan, evaluated: Evaluated
    ) -> Answered:
        strict = engine.settings.strict
        body = systemone.render(engine, planned, evaluated.evaluation, strict)
        return Answered(body, body["usage"]["input_tokens"])

    def state(self, planned: systemone.Plan) -> Any:
        return planned.request.state


log = logging.getLogger("semif_proxy.services")

SERVICES: dict[str, Service] = {"decisions": Decisions(), "systemone": SystemOne()}


def lone_error(service: Service, q: Question, batch: str) -> ApiError:
    """What a request gets for a batch-corrected question that no other state of the batch
    asks: the error it would get alone (400; System One's 422 shape)."""
    message = batch_bias.why_alone(q, batch)
    field = f"{q.path}.bias_correction"
    if service.name == "systemone":
        return systemone_schemas.schema_error(systemone.field_loc(field), message)
    return InvalidRequest(message, field=field)


def render_together(
    engine: DecisionEngine, parts: Sequence[tuple[Service, Any, Evaluated]], batch: str
) -> list[Answered | ApiError]:
    """Several evaluated requests rendered as one batch (a JSON Lines body's lines): the batch
    correction of the questions that ask for it divides out the mean over all of them. A
    request holding such a question that no other state asks is refused (`lone_error`) and
    adds nothing to the others' means. Runs on the engine thread."""
    out: list[Answered | ApiError | None] = [None] * len(parts)
    live = list(range(len(parts)))
    while True:
        lone = {id(q) for q in batch_bias.alone(r.question for i in live for r in parts[i][2].rows)}
        if not lone:
            break
        for i in list(live):
            q = next((r.question for r in parts[i][2].rows if id(r.question) in lone), None)
            if q is not None:
                out[i] = lone_error(parts[i][0], q, batch)
                live.remove(i)
    rows = batch_bias.corrected_across([parts[i][2].rows for i in live])
    for i, corrected in zip(live, rows):
        service, planned, evaluated = parts[i]
        try:
            out[i] = service.render(engine, planned, evaluated.with_rows(corrected))
        except ApiError as exc:
            out[i] = exc
        except Exception:  # a bug in one request's rendering: its own 500, not the others'
            log.exception("unhandled error rendering a request of a batch")
            out[i] = internal_error()
    return [o for o in out if o is not None]


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
