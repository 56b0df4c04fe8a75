"""`startup`: from process start to /ping 200, as SageMaker waits for it, with default settings.

Measured from a warm page cache (the GGUF was read once before), which is what a restarted
process sees; a cold start adds reading the file from disk.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from semif_proxy.testing.server import ProxyProcess


def once(model: Path) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        server = ProxyProcess(
            model,
            {"SEMIF_THREADS": None, "SM_LLAMA_CPP_PARALLEL": None},
            log_path=Path(tmp) / "startup.log",
        )
        start = time.perf_counter()
        server.start(timeout=900)
        took = time.perf_counter() - start
        server.stop()
    return took


def run(model: Path, repeats: int = 3) -> dict[str, Any]:
    with model.open("rb") as fh:  # warm the page cache: every run starts from the same state
        while fh.read(1 << 24):
            pass
    times = [once(model) for _ in range(repeats)]
    return {
        "model_bytes": model.stat().st_size,
        "seconds_to_ping_200": {"median": statistics.median(times), "all": times},
    }
