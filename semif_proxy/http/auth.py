"""Who may call what without the API key, decided on the raw request path.

With SEMIF_API_KEY set, every request needs `Authorization: Bearer <key>` except the few that
are public by design: GET /ping (SageMaker's health check), GET /execution-parameters (a Batch
Transform job asks it itself, without our key) and the playground's static files. /health and
/metrics need the key too: they show versions, pids, devices and traffic.

POST /invocations answers decisions, System One and chat: it is compute, and needs the key like
/v1/*, except where SageMaker fronts the container (SEMIF_INVOCATIONS_PUBLIC, on by default
only under the image's entrypoint called with `serve`, as SageMaker calls it): SageMaker signs
those calls at its edge and sends no key of ours. `semif-proxy serve` on a VM, or the image
under `docker run -p` with no arguments, keeps /invocations behind the key.

The decision is made on the path as the client sent it, not on the one aiohttp routed: a request
is public only when its raw path is exactly one of the public paths in their plain spelling.
Anything that merely normalises to one (`/PING`, `//ping`, `/ping/`, `/p%69ng`,
`/ping/../v1/decisions`) needs the key, so no spelling can be read one way here and another way
by a router (ours or llama-server's).
"""

from __future__ import annotations

import hmac
import re
from urllib.parse import unquote

from aiohttp import web

from semif_proxy.errors import Unauthorized
from semif_proxy.http.middleware import Handler
from semif_proxy.http.routes import playground
from semif_proxy.settings import Settings

# Percent-decoding is repeated until nothing changes (`%2573` -> `%73` -> `s`), at most this often.
_MAX_DECODES = 4


def split_target(raw_target: str) -> tuple[str, str]:
    """(path, raw query) of a request target; the query is kept exactly as sent."""
    path, _, query = raw_target.partition("?")
    return path, query


def normalise_path(raw_target: str) -> str:
    """The one path every router could take this raw request target for: query dropped,
    percent-decoded until stable, backslashes as slashes, repeated slashes collapsed, dot
    segments resolved (never above the root), lower case, no trailing slash."""
    path, _ = split_target(raw_target)
    for _ in range(_MAX_DECODES):
        decoded = unquote(path, errors="replace")
        if decoded == path:
            break
        path = decoded
    path = path.replace("\\", "/")
    segments: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        segments.append(segment)
    return "/" + "/".join(segments).lower()


def public_routes(settings: Settings) -> frozenset[tuple[str, str]]:
    """(method, path) pairs that never need the key. Not /health nor /metrics: they show
    versions, pids, devices and traffic, so with a key set they need it too. /invocations only
    where SageMaker authenticates it at its edge (SEMIF_INVOCATIONS_PUBLIC)."""
    routes = {("GET", "/ping")}
    if settings.invocations_public:
        routes.add(("POST", "/invocations"))
    # Batch Transform asks for its MaxConcurrentTransforms/MaxPayloadInMB/BatchStrategy here
    # before the first call, with no headers of ours; the answer holds nothing secret.
    routes.add(("GET", "/execution-parameters"))
    if settings.playground:
        routes |= {("GET", "/"), ("GET", "/playground")}
        routes |= {("GET", f"/playground/{name}") for name in playground.FILES}
    return frozenset(routes)


def is_public(method: str, raw_target: str, public: frozenset[tuple[str, str]]) -> bool:
    path, _ = split_target(raw_target)
    normal = normalise_path(raw_target)
    # Both: the normalised path is a public one AND the client spelled it exactly that way.
    return (method, normal) in public and path == normal


_BEARER = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +(?P<token>\S.*)")


def key_matches(header: str, key: bytes) -> bool:
    """`Authorization: Bearer <key>` (the scheme in any case), compared in constant time."""
    found = _BEARER.fullmatch(header.strip())
    try:
        token = found.group("token").encode("utf-8", "surrogateescape") if found else b""
    except UnicodeEncodeError:  # not bytes any client could have sent
        token = b""
    return hmac.compare_digest(token, key)


def middleware(settings: Settings) -> web.middleware:
    key = settings.api_key.encode() if settings.api_key else None
    public = public_routes(settings)

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            key is not None
            and not is_public(request.method, request.raw_path, public)
            and not key_matches(request.headers.get("Authorization", ""), key)
        ):
            error = Unauthorized(
                "missing or wrong API key (Authorization: Bearer <SEMIF_API_KEY>)",
                field="Authorization",
            )
            error.headers["WWW-Authenticate"] = 'Bearer realm="semif-proxy"'
            raise error
        return await handler(request)

    return auth
