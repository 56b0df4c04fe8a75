"""Typed keys for the state the aiohttp application shares."""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from semif_proxy.admission import Admission
from semif_proxy.metrics import Metrics
from semif_proxy.settings import Settings

if TYPE_CHECKING:
    pass

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
ENGINE = web.AppKey("engine", "DecisionEngine | None")
LLAMA = web.AppKey("llama_server", "LlamaServer | None")
UPSTREAM = web.AppKey("upstream_session", aiohttp.ClientSession)
DECISION_ADMISSION = web.AppKey("decision_admission", Admission)
CHAT_ADMISSION = web.AppKey("chat_admission", Admission)
