"""`startup`: from process start to /ping 200, as SageMaker waits for it, with default settings
(CPU sharing `dynamic`) and with the gate (one llama-server), and what each process holds in
memory once started: the price of dynamic's second llama-server.

Measured from a warm page cache (the GGUF was read once before), which is what a restarted
process sees; a cold start adds reading the file from disk.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import get_json, memory_kb
from semif_proxy.testing.server import ProxyProcess

DESIGNS = {"default": None, "gate": "gate"}


def once(model: Path, sharing: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        server = ProxyProcess(
            model,
            {"SEMIF_THREADS": None, "SM_LLAMA_CPP_PARALLEL": None, "SEMIF_CPU_SHARING": sharing},
            log_path=Path(tmp) / "startup.log",
        )
        start = time.perf_counter()
        try:
            server.start(timeout=900)
            ready = time.perf_counter() - start
            # The split llama-server starts once the main one is healthy, after /ping is 200.
            split_ready = None
            health = get_json(server.url + "/health")
            while "llama_server_split" in health and time.perf_counter() - start < 900:
                state = health["llama_server_split"].get("state")
                if state == "ready":
                    split_ready = time.perf_counter() - start
                    break
                if state == "stopped":  # failed to start (logged); nothing to wait for
                    break
                time.sleep(0.1)
                health = get_json(server.url + "/health")
            memory = {"proxy": memory_kb(server.proc.pid)}  # type: ignore[union-attr]
            for key in ("llama_server", "llama_server_split"):
                pid = health.get(key, {}).get("pid")
                if pid:
                    memory[key] = memory_kb(pid)
        finally:
            server.stop()
    return {
        "sharing": health["cpu"]["sharing"],
        "seconds_to_ping_200": ready,
        "seconds_to_split_ready": split_ready,
        "memory_kb": memory,
    }


def run(model: Path, repeats: int = 3) -> dict[str, Any]:
    with model.open("rb") as fh:  # warm the page cache: every run starts from the same state
        while fh.read(1 << 24):
            pass
    out: dict[str, Any] = {"model_bytes": model.stat().st_size, "designs": {}}
    for name, sharing in DESIGNS.items():
        runs = [once(model, sharing) for _ in range(repeats)]
        times = [r["seconds_to_ping_200"] for r in runs]
        out["designs"][name] = {
            "sharing": runs[-1]["sharing"],
            "seconds_to_ping_200": {"median": statistics.median(times), "all": times},
            "seconds_to_split_ready": [r["seconds_to_split_ready"] for r in runs],
            "memory_kb": runs[-1]["memory_kb"],
        }
    return out
