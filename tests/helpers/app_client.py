"""The in-process app (aiohttp's TestClient) as tests drive it."""

from __future__ import annotations

import asyncio
from typing import Any


async def settled_ping(client: Any, timeout: float = 600.0) -> dict[str, Any]:
    """/ping once the engine, loading in the background, has finished loading (or failed)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        ping = await (await client.get("/ping")).json()
        if ping["engine"]["state"] != "loading" or loop.time() > deadline:
            return ping
        await asyncio.sleep(0.1)
