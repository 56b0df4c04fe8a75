"""What `semif-proxy eval` asks: a GGUF in this process, a running server by URL, or a
SageMaker endpoint. Each takes a System One or decisions request body and gives the labels'
probabilities (or a failure); the same body goes to each, so they differ only in what answers.

    model.gguf               the engine in-process (no server; the environment's SEMIF_*
                             settings apply, as for `semif-proxy serve`)
    http://host:8080         POST /v1/systemone or /v1/decisions, with an optional API key
    sagemaker:<endpoint>     sagemaker-runtime InvokeEndpoint (the body as /invocations gets it)
"""

from __future__ import annotations

import functools
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from semif_proxy.engine.thread import EngineThread
from semif_proxy.eval.jevbench import label_probabilities, predicted_label

SAGEMAKER_PREFIX = "sagemaker:"


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


def _answer_or_failure(route: str, raw: bytes, seconds: float) -> Answer | Failure:
    try:
        return read_answer(route, json.loads(raw), seconds)
    except (ValueError, KeyError, TypeError) as exc:
        return Failure(f"unexpected response ({type(exc).__name__}: {exc})", seconds)


def _error_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")[:500]


class Target(Protocol):
    name: str

    def ask(self, route: str, body: dict[str, Any]) -> Answer | Failure: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@functools.cache
def shared_engine_thread() -> EngineThread:
    """One engine thread for every model this process evaluates: one OpenMP pool each would
    slow them all (engine_thread.py)."""
    return EngineThread()


@dataclass
class LocalTarget:
    """The GGUF in this process: the same services the routes run, without HTTP."""

    name: str
    path: Path
    engine: Any = None
    settings: Any = None

    @classmethod
    def load(cls, name: str, path: Path) -> LocalTarget:
        from semif_proxy.engine.worker import DecisionEngine
        from semif_proxy.settings import SettingsError, load_settings

        if not path.is_file():
            raise TargetError(f"{name}: no such model file")
        try:
            settings = load_settings(model=str(path), chat=False)
        except SettingsError as exc:
            raise TargetError(f"{name}: {exc}") from None
        try:
            engine = DecisionEngine.load(settings, thread=shared_engine_thread())
        except (RuntimeError, ValueError) as exc:  # not a GGUF, an architecture libllama lacks
            raise TargetError(f"{name}: the model does not load: {exc}") from None
        return cls(name, path, engine, settings)

    def ask(self, route: str, body: dict[str, Any]) -> Answer | Failure:
        from semif_proxy.api import services
        from semif_proxy.errors import ApiError

        # The server's count limits do not bind a run on one's own machine (as `decide`).
        service = (
            services.Decisions(limited=False) if route == "decisions" else services.SystemOne()
        )
        start = time.perf_counter()
        try:
            planned = service.plan(body, self.settings, self.engine.sha256)
            response = service.answer(self.engine, planned).body
        except ApiError as exc:
            seconds = time.perf_counter() - start
            return Failure(str(exc), seconds, exc.status, exc.body())
        return read_answer(route, response, time.perf_counter() - start)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "local", "model": str(self.path)}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None


ROUTES = {"systemone": "/v1/systemone", "decisions": "/v1/decisions"}


@dataclass
class UrlTarget:
    """A running semif-proxy: its own routes, with `Authorization: Bearer <key>` when given."""

    name: str
    url: str
    api_key: str | None = None
    timeout: float = 120.0

    def ask(self, route: str, body: dict[str, Any]) -> Answer | Failure:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            self.url.rstrip("/") + ROUTES[route],
            data=json.dumps(body).encode(),
            headers=headers,
            method="POST",
        )
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return Failure(
                f"HTTP {exc.code}", time.perf_counter() - start, exc.code, _error_body(raw)
            )
        except OSError as exc:  # refused, reset, timed out (URLError is one)
            return Failure(f"{type(exc).__name__}: {exc}", time.perf_counter() - start)
        return _answer_or_failure(route, raw, time.perf_counter() - start)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "url", "url": self.url}

    def close(self) -> None:
        pass


@dataclass
class SageMakerTarget:
    """A SageMaker endpoint: InvokeEndpoint with the request body as JSON; /invocations
    routes it by its shape, so System One and decision rows both work."""

    name: str
    endpoint: str
    client: Any = field(default=None, repr=False)

    @classmethod
    def connect(cls, name: str, endpoint: str, region: str | None = None) -> SageMakerTarget:
        try:
            import boto3
        except ImportError:
            raise TargetError(
                f"{name}: boto3 is not installed (pip install 'semif-proxy[aws]')"
            ) from None
        return cls(name, endpoint, boto3.client("sagemaker-runtime", region_name=region))

    def ask(self, route: str, body: dict[str, Any]) -> Answer | Failure:
        from botocore.exceptions import BotoCoreError, ClientError

        start = time.perf_counter()
        try:
            response = self.client.invoke_endpoint(
                EndpointName=self.endpoint,
                ContentType="application/json",
                Body=json.dumps(body).encode(),
            )
            raw = response["Body"].read()
        except ClientError as exc:
            # A ModelError carries what the container answered (its status and body).
            original = exc.response.get("OriginalMessage")
            status = exc.response.get("OriginalStatusCode") or exc.response.get(
                "ResponseMetadata", {}
            ).get("HTTPStatusCode")
            body = (
                _error_body(original.encode())
                if isinstance(original, str)
                else exc.response.get("Error")
            )
            return Failure(str(exc), time.perf_counter() - start, status, body)
        except BotoCoreError as exc:
            return Failure(f"{type(exc).__name__}: {exc}", time.perf_counter() - start)
        return _answer_or_failure(route, raw, time.perf_counter() - start)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "sagemaker", "endpoint": self.endpoint}

    def close(self) -> None:
        pass


def open_target(
    spec: str, api_key: str | None = None, region: str | None = None, timeout: float = 120.0
) -> Target:
    """A target from its command-line spelling; the spelling is its name in the results."""
    if spec.startswith(SAGEMAKER_PREFIX):
        endpoint = spec[len(SAGEMAKER_PREFIX) :]
        if not endpoint:
            raise TargetError(f"{spec}: name the endpoint (sagemaker:<endpoint name>)")
        return SageMakerTarget.connect(spec, endpoint, region)
    if spec.startswith(("http://", "https://")):
        return UrlTarget(spec, spec, api_key, timeout)
    return LocalTarget.load(spec, Path(spec))
