"""What `semif-proxy eval` asks, whatever it is: a Target takes a System One or decisions
request body and gives the labels' probabilities (an Answer) or a Failure; the same body goes to
each target, so they differ only in what answers. The kinds, each in a module of its own:

    model.gguf               local_target.py: the engine in-process (no server; the
                             environment's SEMIF_* settings apply, as for `semif-proxy serve`);
                             one row at a time
    http://host:8080         url_target.py: POST /v1/systemone or /v1/decisions, with an optional
                             API key, on kept-alive connections (one per row asked at once, reused)
    sagemaker:<endpoint>     sagemaker_target.py: sagemaker-runtime InvokeEndpoint (the body as
                             /invocations gets it)

open_target.py picks one by its spelling. A target is asked from several threads at once (`eval
--concurrency`); a failure carries the status and the Retry-After the runner's retries honour
(runner.py).
"""

from __future__ import annotations

import email.utils
import json
import time
from dataclasses import dataclass
from typing import Any, Protocol

from semif_proxy.eval.jevbench import label_probabilities, predicted_label


class TargetError(ValueError):
    """A target that cannot be used at all (no such file, no boto3): the run does not start."""


@dataclass(frozen=True)
class Answer:
    probabilities: dict[str, float]
    predicted: str
    input_tokens: int
    seconds: float


@dataclass(frozen=True)
class Failure:
    message: str
    seconds: float
    status: int | None = None
    body: Any = None
    # Seconds the target asked to wait before the next try (a 429's or 503's Retry-After).
    retry_after: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.message, "seconds": self.seconds}
        if self.status is not None:
            out["status"] = self.status
        if self.body is not None:
            out["body"] = self.body
        return out


def read_answer(route: str, response: dict[str, Any], seconds: float) -> Answer:
    """The labels' probabilities in a response body. System One answers use JevBench's label
    names (noul: yes/no); decisions use the option ids."""
    if route == "systemone":
        answer = response["answers"]["q"]
        return Answer(
            label_probabilities(answer),
            predicted_label(answer),
            int(response["usage"]["input_tokens"]),
            seconds,
        )
    result = response["result"]
    probs = {str(i): float(p) for i, p in zip(result["option_ids"], result["probabilities"])}
    # max() keeps the first of equal probabilities, as numpy's argmax does.
    return Answer(probs, max(probs, key=probs.__getitem__), int(result["input_tokens"]), seconds)


def answer_or_failure(route: str, raw: bytes, seconds: float) -> Answer | Failure:
    try:
        return read_answer(route, json.loads(raw), seconds)
    except (ValueError, KeyError, TypeError) as exc:
        return Failure(f"unexpected response ({type(exc).__name__}: {exc})", seconds)


def error_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")[:500]


def retry_after(value: str | None) -> float | None:
    """A Retry-After header's seconds: a number of seconds or an HTTP date; None when absent
    or unreadable."""
    if not value:
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


class Target(Protocol):
    name: str

    def ask(self, route: str, body: dict[str, Any]) -> Answer | Failure: ...

    def describe(self) -> dict[str, Any]: ...

    def interrupt(self) -> None:
        """Stop the asks in progress soon (the run was interrupted); close() follows."""

    def close(self) -> None: ...
