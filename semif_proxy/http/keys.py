"""Typed keys for the state the aiohttp application shares."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from semif_proxy.cpu.plan import ThreadPlan
from semif_proxy.cpu.policy import CpuPolicy
from semif_proxy.http.admission import Admission
from semif_proxy.http.metrics import Metrics
from semif_proxy.settings import Settings

if TYPE_CHECKING:
    from semif_proxy.engine.layout import Layout
    from semif_proxy.engine.worker import DecisionEngine


@dataclass
class Startup:
    """Start-up failures of background loads, and what to do about them."""

    on_fatal: Callable[[], None]
    errors: list[str] = field(default_factory=list)
    # Why CPU sharing dynamic's second llama-server is not running: refused by the memory
    # check, or its start failed (None: it runs, or is still to start, or none was planned).
    # /health shows it; nothing retries it.
    second_not_started: str | None = None


@dataclass
class EngineSlot:
    """Where the decision engine goes once its background load ends. aiohttp freezes the app's
    state once it runs, so the load fills this in instead of setting an app key."""

    engine: DecisionEngine | None = None
    # Set once the load has ended, loaded or failed: what waits for it (the main
    # llama-server's start on the CPU, http/lifecycle.py) never waits on a failed load.
    load_over: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class LayoutSlot:
    """The weights' layout (SEMIF_REPACK) for this start, decided once before anything loads
    (with `auto` by a measurement in throw-away children: engine/layout.py); the engine and
    every llama-server wait for it and obey it."""

    layout: Layout | None = None  # None once decided: the server stopped first
    decided: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
ENGINE = web.AppKey("engine", EngineSlot)
LAYOUT = web.AppKey("layout", LayoutSlot)
LLAMA = web.AppKey("llama_server", "LlamaServer | None")
# SEMIF_CPU_SHARING=dynamic's second llama-server (part of the threads), else None.
LLAMA_SECOND = web.AppKey("llama_server_split", "LlamaServer | None")
UPSTREAM = web.AppKey("upstream_session", aiohttp.ClientSession)
DECISION_ADMISSION = web.AppKey("decision_admission", Admission)
CHAT_ADMISSION = web.AppKey("chat_admission", Admission)
STARTUP = web.AppKey("startup", Startup)
THREAD_PLAN = web.AppKey("threads", ThreadPlan)
# How decisions and chat share the cores (cpu/policy.py).
CPU_POLICY = web.AppKey("cpu_policy", CpuPolicy)
