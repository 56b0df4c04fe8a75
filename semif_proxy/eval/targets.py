"""What `semif-proxy eval` asks: a GGUF in this process, a running server by URL, or a
SageMaker endpoint. Each takes a System One or decisions request body and gives the labels'
probabilities (or a failure); the same body goes to each, so they differ only in what answers.

    model.gguf               the engine in-process (no server; the environment's SEMIF_*
                             settings apply, as for `semif-proxy serve`); one row at a time
    http://host:8080         POST /v1/systemone or /v1/decisions, with an optional API key, on
                             kept-alive connections (one per row asked at once, reused)
    sagemaker:<endpoint>     sagemaker-runtime InvokeEndpoint (the body as /invocations gets it)

A target is asked from several threads at once (`eval --concurrency`); a failure carries the
status and the Retry-After the runner's retries honour (runner.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import functools
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

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


@functools.cache
def shared_engine_thread() -> EngineThread:
    """One engine thread for every model this process evaluates: one OpenMP pool each would
    slow them all (engine/thread.py)."""
    return EngineThread()


@dataclass
class LocalTarget:
    """The GGUF in this process: the same services the routes run, without HTTP."""

    name: str
    path: Path
    engine: Any = None
    settings: Any = None
    # The engine answers one request at a time: rows asked at once wait here, not in it.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

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
        with self.lock:
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

    def interrupt(self) -> None:
        pass  # the row in progress finishes (seconds); close() waits for it

    def close(self) -> None:
        with self.lock:
            if self.engine is not None:
                self.engine.close()
                self.engine = None


ROUTES = {"systemone": "/v1/systemone", "decisions": "/v1/decisions"}


class Session:
    """One aiohttp ClientSession for a URL target, on an event loop in a thread of its own: its
    pool keeps connections alive from row to row (one for each row asked at once), and the
    threads that ask rows wait on it."""

    def __init__(self, timeout: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="eval-http", daemon=True)
        self.thread.start()
        self.timeout = timeout
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.session: aiohttp.ClientSession = self._run(self._open())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _open(self) -> aiohttp.ClientSession:
        # Per connect and per read, as urllib's timeout was: a long answer that keeps coming is
        # not cut.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.timeout, sock_read=self.timeout
        )
        return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))

    async def _post(self, url: str, data: bytes, headers: dict[str, str]) -> Any:
        # A kept-alive connection the server closed while it was idle fails at once: once more
        # on a new one.
        for retry in (False, True):
            try:
                async with self.session.post(url, data=data, headers=headers) as response:
                    return (
                        response.status,
                        response.headers.get("Retry-After"),
                        await response.read(),
                    )
            except aiohttp.ServerDisconnectedError:
                if retry:
                    raise
        raise AssertionError("unreachable")

    def post(self, url: str, data: bytes, headers: dict[str, str]) -> tuple[int, str | None, bytes]:
        """Status, Retry-After and body, from any thread."""
        with self._lock:
            if self._closed:
                raise ConnectionAbortedError("the run was interrupted")
            future = asyncio.run_coroutine_threadsafe(self._post(url, data, headers), self.loop)
            self._pending.add(future)
        try:
            return future.result()
        finally:
            with self._lock:
                self._pending.discard(future)

    def close(self) -> None:
        """Stop the posts in progress (they fail at once), close the pool and the loop."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending)
        for future in pending:
            future.cancel()
        self._run(self.session.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@dataclass
class UrlTarget:
    """A running semif-proxy: its own routes, with `Authorization: Bearer <key>` when given,
    through one session whose connections are kept alive from row to row."""

    name: str
    url: str
    api_key: str | None = None
    timeout: float = 120.0
    _session: Session | None = field(default=None, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        try:
            parts.port  # noqa: B018 (a port that is no number raises here)
        except ValueError:
            raise TargetError(f"{self.url}: the port is not a number from 1 to 65535") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TargetError(f"{self.url}: not an http:// or https:// URL with a host")

    def session(self) -> Session:
        """The session, opened on the first ask (a target never asked holds nothing)."""
        with self._lock:
            if self._closed:
                raise ConnectionAbortedError("the run was interrupted")
            if self._session is None:
                self._session = Session(self.timeout)
            return self._session

    def ask(self, route: str, body: dict[str, Any]) -> Answer | Failure:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        start = time.perf_counter()
        try:
            status, wait, raw = self.session().post(
                self.url.rstrip("/") + ROUTES[route], json.dumps(body).encode(), headers
            )
        except concurrent.futures.CancelledError:
            return Failure("interrupted", time.perf_counter() - start)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:  # refused, reset
            return Failure(f"{type(exc).__name__}: {exc}", time.perf_counter() - start)
        seconds = time.perf_counter() - start
        if not 200 <= status < 300:
            return Failure(f"HTTP {status}", seconds, status, _error_body(raw), retry_after(wait))
        return _answer_or_failure(route, raw, seconds)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "url", "url": self.url}

    def interrupt(self) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            session, self._session = self._session, None
        if session is not None:
            session.close()


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

    def interrupt(self) -> None:
        pass  # the call in progress finishes (boto3 has no way to abort it)

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
