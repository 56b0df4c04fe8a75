"""The eval target that is a running semif-proxy by URL: its own routes, through one aiohttp
session on an event loop in a thread of its own, whose connections are kept alive from row to
row."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from semif_proxy.eval.targets import (
    Answer,
    Failure,
    TargetError,
    answer_or_failure,
    error_body,
    retry_after,
)

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
            return Failure(f"HTTP {status}", seconds, status, error_body(raw), retry_after(wait))
        return answer_or_failure(route, raw, seconds)

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
