"""GET / and /playground: the browser playground (static files shipped in the package)."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from semif_proxy.errors import NotFound

STATIC = Path(__file__).resolve().parent.parent / "playground"
FILES = {
    "index.html": "text/html",
    "style.css": "text/css",
    "app.js": "text/javascript",
    "examples.js": "text/javascript",
}
# Everything comes from this server: the page must work on an isolated endpoint.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self'; img-src 'self' data:",
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
}


def _file(name: str) -> web.Response:
    if name not in FILES:
        raise NotFound(f"no playground file {name!r}")
    return web.Response(
        body=(STATIC / name).read_bytes(),
        content_type=FILES[name],
        charset="utf-8",
        headers=HEADERS,
    )


async def page(request: web.Request) -> web.Response:
    return _file("index.html")


async def asset(request: web.Request) -> web.Response:
    return _file(request.match_info["name"])


def register(app: web.Application) -> None:
    app.router.add_get("/", page)
    app.router.add_get("/playground", page)
    app.router.add_get("/playground/{name}", asset)
