"""JSON Lines bodies on POST /invocations: one request per line, one answer line per line.

SageMaker Batch Transform with `SplitType=Line` sends one line per call (`SingleRecord`, what
GET /execution-parameters advises) or as many lines as `MaxPayloadInMB` allows (`MultiRecord`),
and with `AssembleWith=Line` writes the answers of every call one after another: the output
only lines up with the input if each call answers exactly one line per line, in order. So a
line that is bad input (not JSON, an unknown shape, a schema error, too many tokens or prompts,
a blank line) is answered with an error object on its own line and never fails its neighbours.
What is not the line's fault fails the whole call, so that SageMaker retries it and, failing
that, fails the job: a line the deadline did not reach (504), an engine failure (503).

No aiohttp here: the route reads the body within its admission slot and hands it over with its
way onto the engine (http/engine_job.py). This module splits the body into lines, validates
each line on its own (on a worker thread, before anything queues for the engine), groups the
lines by state so that one state's lines run one after another (the engine keeps the last
prefix it evaluated, so the state is prefilled once per group), answers them in engine jobs of
at most JSON_LINES_PER_JOB lines, and renders the answer lines.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from semif_proxy.api import services
from semif_proxy.errors import (
    ApiError,
    Cancelled,
    EngineFailure,
    InvalidRequest,
    PayloadTooLarge,
    Timeout,
    Unavailable,
    internal_error,
)
from semif_proxy.http.bodies import parse_json
from semif_proxy.http.line_prompts import check_prompts
from semif_proxy.settings import JSON_LINES_PER_JOB, Settings

if TYPE_CHECKING:
    from semif_proxy.api.services import Evaluated, Service
    from semif_proxy.engine.worker import DecisionEngine

log = logging.getLogger("semif_proxy.jsonlines")
T = TypeVar("T")


class EngineAccess(Protocol):
    """What a call needs of the engine: the route's admitted way onto it (http/engine_job.py)."""

    @property
    def engine(self) -> DecisionEngine: ...

    async def run(self, fn: Callable[[], T]) -> T: ...  # on the engine thread

    async def off_loop(self, fn: Callable[[], T]) -> T: ...  # on a worker thread


# What Batch Transform jobs and clients send for JSON Lines; we answer in the first spelling.
MEDIA_TYPES = frozenset({"application/jsonlines", "application/jsonl", "application/x-jsonlines"})
CONTENT_TYPE = "application/jsonlines"


def split_lines(raw: bytes) -> list[bytes]:
    """The body's lines as JSON Lines defines them: each ends with a newline, the last one may
    not (a final newline ends the last line and starts none); a carriage return before the
    newline is dropped. A blank line in between is a line (and gets an error)."""
    if not raw:
        return []
    lines = raw.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def check_line_count(count: int, limit: int) -> None:
    if count > limit:
        raise PayloadTooLarge(
            f"body has {count} lines, over the limit of {limit} (SEMIF_MAX_BATCH_LINES)",
            field="body",
            lines=count,
            limit=limit,
        )


@dataclass
class Line:
    number: int  # 1-based, within this call's body
    state: str | None = None  # the state as its prompt renders it: lines group by it
    service: Service | None = None  # None: the line failed validation (see error)
    planned: Any = None  # what its service planned
    evaluated: Evaluated | None = None  # its engine rows, before the batch is rendered
    answer: dict[str, Any] | None = None
    error: ApiError | None = None
    tokens: int = 0

    @property
    def done(self) -> bool:
        return self.answer is not None or self.error is not None


def _state_key(state: Any) -> str:
    # The same text for a decision's and a System One request's state (schemas.Decision's own
    # key): both render the state into the prompt with this json.dumps.
    return json.dumps(state, ensure_ascii=False)


def _plan(raw: bytes, settings: Settings, sha256: str) -> tuple[str, Service, Any]:
    if not raw.strip():
        raise InvalidRequest(
            "the line is blank; every line must hold one JSON request (a blank line is "
            "answered with this error so that answers stay line for line)",
            field="body",
        )
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("the line must be a JSON object", field="body")
    service = services.find(body)
    if service is None:
        raise InvalidRequest(
            "chat is not served in JSON Lines (a batch of generations would hold the engine "
            "and llama-server for minutes); send each chat as its own application/json request",
            field="messages",
        )
    check_prompts(body, service.name, settings)
    planned = service.plan(body, settings, sha256)
    return _state_key(service.state(planned)), service, planned


def plan_line(raw: bytes, number: int, settings: Settings, sha256: str) -> Line:
    """Validate one line as the same body alone would be validated; a failure becomes the
    line's error instead of the call's."""
    line = Line(number)
    try:
        line.state, line.service, line.planned = _plan(raw, settings, sha256)
    except ApiError as exc:
        line.error = exc
    return line


def plan_lines(texts: Sequence[bytes], settings: Settings, sha256: str) -> list[Line]:
    """Every line planned, numbered from 1. Off the event loop (a worker thread): a body
    limit's worth of lines takes seconds to validate."""
    return [plan_line(text, number, settings, sha256) for number, text in enumerate(texts, 1)]


def plan_for(engine: DecisionEngine, texts: Sequence[bytes], settings: Settings) -> list[Line]:
    """plan_lines for this engine; none where it cannot decide for this model: the call gets
    the 503 a single request gets, naming why, before any line is planned."""
    if engine.unavailable_reason:
        raise Unavailable(engine.unavailable_reason)
    return plan_lines(texts, settings, engine.sha256)


def groups(lines: Sequence[Line]) -> list[list[Line]]:
    """The valid lines by state, in the order each state first appears; within a state, in
    line order. Only the order of work changes: every line is answered on its own line."""
    by_state: dict[str | None, list[Line]] = {}
    for line in lines:
        if line.service is not None:
            by_state.setdefault(line.state, []).append(line)
    return list(by_state.values())


class Progress:
    """Answers as the engine thread produces them, until the call stops waiting (its deadline
    passed, or it failed): an answer that comes after that is dropped, so what answer_body
    counts and renders never changes under it."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.answered = 0
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def record(
        self,
        line: Line,
        answer: dict[str, Any] | None = None,
        tokens: int = 0,
        error: ApiError | None = None,
    ) -> None:
        with self._lock:
            if self._closed:
                return
            line.answer, line.tokens, line.error = answer, tokens, error
            self.answered += 1

    def evaluated(self, line: Line, evaluated: Evaluated) -> None:
        with self._lock:
            if not self._closed:
                line.evaluated = evaluated


def run_lines(engine: DecisionEngine, lines: Sequence[Line], progress: Progress) -> None:
    """Evaluate lines of one state one after another, on the engine thread. The engine keeps
    the prefix it evaluated last, so the first line prefills the state and the others reuse
    it. A line's failure is its own error line, unless the engine failed."""
    for line in lines:
        if progress.closed:
            return
        assert line.service is not None
        with _line_errors(line, progress):
            progress.evaluated(line, line.service.evaluate(engine, line.planned))


def render_lines(engine: DecisionEngine, lines: Sequence[Line], progress: Progress) -> None:
    """Every evaluated line rendered, as one batch: a batch correction divides out the mean
    over all of this body's lines that ask the same (api/services.py). On the engine thread."""
    if progress.closed:  # the call already failed (deadline): render and log nothing
        return
    ready = [line for line in lines if line.evaluated is not None and not line.done]
    parts = [(line.service, line.planned, line.evaluated) for line in ready]
    for line, got in zip(ready, services.render_together(engine, parts, "lines of this body")):
        if isinstance(got, ApiError):
            progress.record(line, error=got)
        else:
            progress.record(line, got.body, got.input_tokens)


@contextlib.contextmanager
def _line_errors(line: Line, progress: Progress) -> Iterator[None]:
    """Bad input is the line's own error line; an engine failure, or the job aborted
    (deadline, hang-up), fails the whole call."""
    try:
        yield
    except Cancelled:
        raise  # the job was aborted (deadline, hang-up): the lines left are not reached
    except (EngineFailure, Unavailable):
        raise  # the engine's fault, not the line's: the call fails whole (503), and retried
    except ApiError as exc:
        progress.record(line, error=exc)
    except Exception:
        log.exception(
            "unhandled error in a JSON Lines line",
            extra={"request_id": progress.request_id, "line": line.number},
        )
        progress.record(line, error=internal_error())


def unfinished(lines: Sequence[Line]) -> int:
    """How many lines have neither an answer nor an error: the deadline did not reach them."""
    return sum(1 for line in lines if not line.done)


def not_reached(count: int, total: int, timeout: float) -> Timeout:
    """The whole call's 504 when the deadline left lines unanswered. Not a 200 with timeout
    lines: SageMaker retries a failed call, then fails the job where anyone looks, but takes a
    200's error lines as the results and completes the job with them."""
    return Timeout(
        f"{count} of {total} lines were not answered within the request's {timeout:g}s "
        "(SEMIF_REQUEST_TIMEOUT), so no line is answered; send fewer lines per call "
        "(BatchStrategy SingleRecord, as GET /execution-parameters advises)",
        field="body",
        lines=total,
        unanswered=count,
        limit=timeout,
    )


@dataclass(frozen=True)
class Answered:
    """A JSON Lines call's answer: the body, and what the access log says of it."""

    body: bytes
    lines: int
    errors: int
    states: int
    tokens: int


async def answer_body(
    raw: bytes, settings: Settings, call: EngineAccess, request_id: str
) -> Answered:
    """Every line planned within the deadline, the valid ones answered on the engine grouped by
    state, one answer line per line, in order. A line the deadline did not reach fails the
    whole call (504), as does an engine that fails (503), so that SageMaker retries the call
    rather than keep error lines."""
    texts = split_lines(raw)
    if not texts:
        raise InvalidRequest("the JSON Lines body has no lines", field="body")
    check_line_count(len(texts), settings.max_batch_lines)
    lines = await call.off_loop(functools.partial(plan_for, call.engine, texts, settings))
    by_state = groups(lines)
    progress = Progress(request_id)
    try:
        for group in by_state:
            for start in range(0, len(group), JSON_LINES_PER_JOB):
                part = group[start : start + JSON_LINES_PER_JOB]
                await call.run(functools.partial(run_lines, call.engine, part, progress))
        # Rendered once every line is evaluated: a batch correction spans the whole body.
        await call.run(functools.partial(render_lines, call.engine, lines, progress))
    except Timeout:
        progress.close()  # from here on the engine thread's late answers are dropped
        count = unfinished(lines)
        raise not_reached(count, len(lines), settings.request_timeout) from None
    finally:
        progress.close()
    return Answered(
        body=render(lines, request_id),
        lines=len(lines),
        errors=sum(1 for line in lines if line.error is not None),
        states=len(by_state),
        tokens=sum(line.tokens for line in lines),
    )


def output(line: Line, request_id: str) -> dict[str, Any]:
    """A line's answer, or the error body the same request alone would get, with the line's
    number and the status it would have had."""
    if line.answer is not None:
        return line.answer
    error = line.error or internal_error()
    body = error.body()
    if "error" in body:
        body["error"]["request_id"] = request_id
    return {**body, "line": line.number, "status": error.status}


def render(lines: Sequence[Line], request_id: str) -> bytes:
    """One JSON object per line, no newline after the last: SageMaker's AssembleWith=Line adds
    one after each call's answer, and a second would leave a blank line between calls."""
    return "\n".join(json.dumps(output(line, request_id)) for line in lines).encode("utf-8")
