"""Typed keys for the state the aiohttp application shares."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from semif_proxy.admission import Admission
from semif_proxy.cpu import ThreadPlan
from semif_proxy.cpu_dynamic import CpuDynamicSplit
from semif_proxy.cpu_gate import CpuGate
from semif_proxy.cpu_slicer import CpuSlicer
from semif_proxy.metrics import Metrics
from semif_proxy.settings import Settings

if TYPE_CHECKING:
    from semif_proxy.engine import DecisionEngine


@dataclass
class Startup:
    """Start-up failures of background loads, and what to do about them."""

    on_fatal: Callable[[], None]
    errors: list[str] = field(default_factory=list)
    # Why CPU sharing dynamic's second llama-server is not running: refused by the memory
    # check, or its start failed (None: it runs, or is still to start, or none was planned).
    # /health shows it; nothing retries it.
    split_not_started: str | None = None


@dataclass
class EngineSlot:
    """Where the decision engine goes once its background load ends. aiohttp freezes the app's
    state once it runs, so the load fills this in instead of setting an app key."""

    engine: DecisionEngine | None = None


SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
ENGINE = web.AppKey("engine", EngineSlot)
LLAMA = web.AppKey("llama_server", "LlamaServer | None")
# SEMIF_CPU_SHARING=dynamic's second llama-server (half the threads), else None.
LLAMA_SPLIT = web.AppKey("llama_server_split", "LlamaServer | None")
UPSTREAM = web.AppKey("upstream_session", aiohttp.ClientSession)
DECISION_ADMISSION = web.AppKey("decision_admission", Admission)
CHAT_ADMISSION = web.AppKey("chat_admission", Admission)
STARTUP = web.AppKey("startup", Startup)
THREADS = web.AppKey("threads", ThreadPlan)
# The CPU gate or, with SEMIF_CPU_SHARING=slice, the slicer, or with dynamic, the dynamic
# split (same interface).
GATE = web.AppKey("cpu_gate", CpuGate | CpuSlicer | CpuDynamicSplit)
