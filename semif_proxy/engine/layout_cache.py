"""Where SEMIF_REPACK=auto keeps its measurements: one JSON file per llama.cpp build, extension,
model file, CPU and thread count, under ~/.cache/semif-proxy/layouts (or $XDG_CACHE_HOME), so a
restart on the same machine does not measure again."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from dataclasses import asdict
from pathlib import Path

from semif_proxy.engine.layout_trial import LayoutRun, run_from
from semif_proxy.settings.defaults import (
    LAYOUT_PROBE_GENERATE_TOKENS,
    LAYOUT_PROBE_PREFILL_TOKENS,
    LAYOUT_PROBE_REPEATS,
)

log = logging.getLogger("semif_proxy.layout")

# Bumped when what a probe measures changes: older files are then measured again.
PROBE_VERSION = 1


def cpu_text() -> str:
    """The CPU's model name and flags: a measurement is kept per CPU."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    keep = ("model name", "flags", "Features", "CPU part")
    pairs = (x.partition(":") for x in lines)
    seen = {k.strip(): v.strip() for k, _, v in pairs if k.strip() in keep}
    return json.dumps(seen, sort_keys=True)


def cache_dir() -> Path | None:
    """None: no home to keep it in (an arbitrary uid without a passwd entry): measured at
    every start."""
    # XDG_CACHE_HOME: where SEMIF_REPACK=auto keeps its measurements (in semif-proxy/layouts
    # under it); unset: ~/.cache.
    root = os.environ.get("XDG_CACHE_HOME")
    if not root:
        try:
            root = str(Path.home() / ".cache")
        except RuntimeError:
            return None
    return Path(root) / "semif-proxy" / "layouts"


def cache_key(model: Path, threads: int, backend_dir: Path | None) -> str:
    from semif_proxy import _engine
    from semif_proxy.engine import native

    stat = model.stat()
    ext = Path(_engine.__file__)
    build = native.build_info()  # its device list grows once backends load: not in the key
    parts = {
        "version": PROBE_VERSION,
        "build": [build["llama_cpp_build"], build["llama_cpp_commit"]],
        "extension": [str(ext.resolve()), ext.stat().st_mtime_ns],
        "backend_dir": str(backend_dir or ""),
        "model": [str(model.resolve()), stat.st_size, stat.st_mtime_ns],
        "threads": threads,
        "cpu": cpu_text(),
        "probe": [LAYOUT_PROBE_PREFILL_TOKENS, LAYOUT_PROBE_GENERATE_TOKENS, LAYOUT_PROBE_REPEATS],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _cached_run(repack: bool, row: object) -> LayoutRun:
    if isinstance(row, dict) and isinstance(row.get("failed"), str) and row.get("lasting"):
        return LayoutRun(repack, failed=row["failed"], lasting=True)
    return run_from(repack, row)


def read_cached(path: Path) -> tuple[LayoutRun, LayoutRun] | None:
    """The kept pair; anything else in the file (another version's, a hand edit) is a miss."""
    try:
        rows = json.loads(path.read_text())
        return _cached_run(False, rows["off"]), _cached_run(True, rows["on"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_cached(path: Path, off: LayoutRun, on: LayoutRun) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, prefix=path.stem, suffix=".part", delete=False
        ) as part:
            part.write(json.dumps({"off": asdict(off), "on": asdict(on)}))
        os.replace(part.name, path)  # a reader sees the whole file or none
    except OSError as exc:  # a read-only home: measured again at the next start
        log.warning(f"the layout measurement is not kept: {exc}")
