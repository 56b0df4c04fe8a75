"""SEMIF_REPACK=auto decided by measurement on the machine it runs on (issue #36).

Each layout of the weights is loaded and timed in a throw-away child (layout_probe.py), one after
the other, before anything else loads: a layout whose kernels crash on this CPU (the base image's
repacked AMX kernels died of SIGILL on a Xeon) kills only its child and is out. Then:

- the repacked layout holds no copy of its own (the model has no tensor type with a repacked
  layout on this CPU): unrepacked, the same kernels;
- repacked is less than LAYOUT_GAIN_MIN faster, in prefill (decisions) or, with chat on, in
  generation, or that much slower in the other: unrepacked, whose one mmap'ed copy of the
  weights every process shares;
- every process's repacked copy would take over half the memory left (memory is tight):
  unrepacked unless the gain is at least LAYOUT_GAIN_LARGE, and never where the copies would
  not fit;
- otherwise repacked, the faster.

The engine and every llama-server then obey that one choice. The measurement is kept in a
file per llama.cpp build, model file, CPU and thread count (under ~/.cache/semif-proxy/layouts,
or $XDG_CACHE_HOME), so a restart on the same machine does not pay for it again. With layers
on a GPU, or where neither child could measure, the rule of settings/repack.py decides.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from semif_proxy.settings import RepackChoice, Settings, repack_choice
from semif_proxy.settings.defaults import (
    LAYOUT_GAIN_LARGE,
    LAYOUT_GAIN_MIN,
    LAYOUT_PROBE_GENERATE_TOKENS,
    LAYOUT_PROBE_PREFILL_TOKENS,
    LAYOUT_PROBE_REPEATS,
    LAYOUT_PROBE_TIMEOUT_S,
    LAYOUT_REPACKED_SHARE_MIN,
)

log = logging.getLogger("semif_proxy.layout")

MIB = 1 << 20
# Bumped when what a probe measures changes: older files are then measured again.
PROBE_VERSION = 1
PROBE_COMMAND = (sys.executable, "-m", "semif_proxy.engine.layout_probe")


@dataclass(frozen=True)
class LayoutRun:
    """One child's measurement of one layout; `failed` says why it has none."""

    repack: bool
    failed: str | None = None
    prefill_tokens_per_s: float | None = None
    generate_tokens_per_s: float | None = None
    anon_bytes: int | None = None
    load_seconds: float | None = None


@dataclass(frozen=True)
class Layout:
    """The choice, why, and what it was made from (None: not measured)."""

    choice: RepackChoice
    runs: tuple[LayoutRun, ...] | None = None
    cached: bool = False
    seconds: float = 0.0

    def as_dict(self) -> dict:
        out: dict = {"on": self.choice.on, "why": self.choice.why}
        if self.runs is not None:
            out["measured"] = {("on" if r.repack else "off"): asdict(r) for r in self.runs}
            out["cached"] = self.cached
            out["seconds"] = round(self.seconds, 2)
        return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def decide(
    off: LayoutRun,
    on: LayoutRun,
    *,
    model_bytes: int,
    processes: int,
    room: int | None,
    chat: bool,
) -> RepackChoice | None:
    """The layout from the two measurements (None: neither measured; the rule decides).
    `processes`: how many will hold the model (the engine and each llama-server); `room`: the
    memory left at start-up in bytes (None: unknown)."""
    if off.failed and on.failed:
        return None
    if on.failed:
        return RepackChoice(False, f"off: the repacked layout failed its trial ({on.failed})")
    if off.failed:
        return RepackChoice(True, f"on: the unrepacked layout failed its trial ({off.failed})")
    extra = (on.anon_bytes or 0) - (off.anon_bytes or 0)
    if extra < max(16 * MIB, LAYOUT_REPACKED_SHARE_MIN * model_bytes):
        return RepackChoice(
            False,
            f"off: nothing of this model is repacked on this CPU ({extra / MIB:.0f} MiB of its "
            "own): the same kernels either way, and every process shares one copy",
        )
    prefill = _ratio(on.prefill_tokens_per_s, off.prefill_tokens_per_s)
    generate = _ratio(on.generate_tokens_per_s, off.generate_tokens_per_s) if chat else None
    gains = [g for g in (prefill, generate) if g is not None]
    gain = max(gains) if gains else 1.0
    seen = f"repacked vs not, measured here: prefill {prefill or 0:.2f}x" + (
        f", generation {generate:.2f}x" if generate is not None else ""
    )
    copies = processes * extra
    if gain < LAYOUT_GAIN_MIN:
        return RepackChoice(
            False,
            f"off: {seen} (under {LAYOUT_GAIN_MIN:.2f}x); every process shares one copy of "
            f"the weights instead of {processes} x {extra / MIB:.0f} MiB",
        )
    if min(gains) < 1 / LAYOUT_GAIN_MIN:  # faster at one path, measurably slower at the other
        return RepackChoice(
            False,
            f"off: {seen}: slower at one of the two; every process shares one copy of the weights",
        )
    tight = room is not None and copies > room // 2
    if tight and (gain < LAYOUT_GAIN_LARGE or copies > (room or 0)):
        return RepackChoice(
            False,
            f"off: {seen}, but {processes} repacked copies ({copies / MIB:.0f} MiB) would "
            f"take over half the {(room or 0) / MIB:.0f} MiB left; one shared copy instead",
        )
    return RepackChoice(
        True,
        f"on: {seen}; each of {processes} processes holds its own copy ({extra / MIB:.0f} MiB)",
    )


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


def cache_dir() -> Path:
    # XDG_CACHE_HOME: where SEMIF_REPACK=auto keeps its measurements (in semif-proxy/layouts
    # under it); unset: ~/.cache.
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "semif-proxy" / "layouts"


def cache_key(model: Path, threads: int, backend_dir: Path | None) -> str:
    from semif_proxy import _engine
    from semif_proxy.engine import native

    stat = model.stat()
    ext = Path(_engine.__file__)
    parts = {
        "version": PROBE_VERSION,
        "build": native.build_info(),
        "extension": [str(ext.resolve()), ext.stat().st_mtime_ns],
        "backend_dir": str(backend_dir or ""),
        "model": [str(model.resolve()), stat.st_size, stat.st_mtime_ns],
        "threads": threads,
        "cpu": cpu_text(),
        "probe": [LAYOUT_PROBE_PREFILL_TOKENS, LAYOUT_PROBE_GENERATE_TOKENS, LAYOUT_PROBE_REPEATS],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


async def probe(
    model: Path,
    threads: int,
    repack: bool,
    backend_dir: Path | None = None,
    command: tuple[str, ...] = PROBE_COMMAND,
    timeout: float = LAYOUT_PROBE_TIMEOUT_S,
) -> LayoutRun:
    """One layout timed in a child; its crash, error or silence is the run's `failed`. A
    cancelled probe (the server stopping) kills its child."""
    argv = [*command, "--model", str(model), "--threads", str(threads)]
    argv += ["--repack", "on" if repack else "off"]
    if backend_dir is not None:
        argv += ["--backend-dir", str(backend_dir)]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError as exc:
        return LayoutRun(repack, failed=f"could not start: {exc}")
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        return LayoutRun(repack, failed=f"no answer within {timeout:.0f} s")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode < 0:
        return LayoutRun(repack, failed=f"its process died of signal {-proc.returncode}")
    if proc.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return LayoutRun(repack, failed=f"exit {proc.returncode}: {last[:200]}")
    try:
        row = json.loads(out.decode().strip().splitlines()[-1])
    except (IndexError, ValueError):
        return LayoutRun(repack, failed="no measurement in its output")
    return LayoutRun(
        repack,
        prefill_tokens_per_s=row.get("prefill_tokens_per_s"),
        generate_tokens_per_s=row.get("generate_tokens_per_s"),
        anon_bytes=row.get("anon_bytes"),
        load_seconds=row.get("load_seconds"),
    )


def _read_cached(path: Path) -> tuple[LayoutRun, LayoutRun] | None:
    try:
        rows = json.loads(path.read_text())
        return LayoutRun(**rows["off"]), LayoutRun(**rows["on"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cached(path: Path, off: LayoutRun, on: LayoutRun) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(f".{os.getpid()}.part")
        part.write_text(json.dumps({"off": asdict(off), "on": asdict(on)}))
        os.replace(part, path)  # a reader sees the whole file or none
    except OSError as exc:  # a read-only home: measured again at the next start
        log.warning(f"the layout measurement is not kept: {exc}")


async def measured_runs(
    model: Path, threads: int, backend_dir: Path | None = None, **probe_args: Any
) -> tuple[LayoutRun, LayoutRun, bool]:
    """(off, on, cached): from the cache file, else measured now (unrepacked first) and kept."""
    path = cache_dir() / f"{cache_key(model, threads, backend_dir)}.json"
    hit = _read_cached(path)
    if hit is not None:
        return hit[0], hit[1], True
    # One after the other: side by side, each would take the other's cores.
    off = await probe(model, threads, False, backend_dir, **probe_args)
    on = await probe(model, threads, True, backend_dir, **probe_args)
    if not (off.failed and on.failed):  # nothing learned is not kept
        _write_cached(path, off, on)
    return off, on, False


async def resolve(
    settings: Settings, threads: int, processes: int, room: int | None, **probe_args: Any
) -> Layout:
    """SEMIF_REPACK for this start: as set, the rule (a GPU, nothing measured), or measured."""
    if settings.repack != "auto" or settings.n_gpu_layers != 0:
        return Layout(repack_choice(settings.repack))
    start = time.perf_counter()
    try:
        off, on, cached = await measured_runs(
            settings.model_path, threads, settings.backend_dir, **probe_args
        )
    except OSError:  # the model file cannot be read: the engine's load says why
        return Layout(repack_choice(settings.repack))
    choice = decide(
        off,
        on,
        model_bytes=settings.model_path.stat().st_size,
        processes=processes,
        room=room,
        chat=settings.chat,
    )
    seconds = time.perf_counter() - start
    if choice is None:
        rule = repack_choice(settings.repack)
        why = f"{rule.why} (neither layout could be measured: {off.failed})"
        return Layout(RepackChoice(rule.on, why), (off, on), cached, seconds)
    return Layout(choice, (off, on), cached, seconds)


def resolve_now(
    settings: Settings, threads: int, processes: int, room: int | None, **probe_args: Any
) -> Layout:
    """resolve() for a caller without an event loop (a command's engine load)."""
    return asyncio.run(resolve(settings, threads, processes, room, **probe_args))
