"""SEMIF_REPACK=auto decided by measurement on the machine it runs on (issue #36).

Each layout of the weights is loaded and timed in a throw-away child (layout_probe.py, started by
layout_trial.py), one after the other, before anything else loads: a layout whose kernels crash
on this CPU (the base image's repacked AMX kernels died of SIGILL on a Xeon) kills only its child
and is out. Then:

- the repacked layout holds no copy of its own (the model has no tensor type with a repacked
  layout on this CPU): unrepacked, the same kernels;
- repacked is less than LAYOUT_GAIN_MIN faster, in prefill (decisions) or, with chat on, in
  generation, or that much slower in the other: unrepacked, whose one mmap'ed copy of the
  weights every process shares;
- every process's repacked copy would take over half the memory left (memory is tight):
  unrepacked unless the gain is at least LAYOUT_GAIN_LARGE, and never where the copies would
  not fit;
- otherwise repacked, the faster.

The engine and every llama-server then obey that one choice. What holds for the machine (both
measured, or a layout's crash) is kept per llama.cpp build, model file, CPU and thread count
(layout_cache.py), so a restart on the same machine does not pay for it again. With layers
on a GPU, or where neither child could measure, the rule of settings/repack.py decides.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from semif_proxy.engine.layout_cache import cache_dir, cache_key, read_cached, write_cached
from semif_proxy.engine.layout_trial import LayoutRun, probe
from semif_proxy.settings import RepackChoice, Settings, repack_choice
from semif_proxy.settings.defaults import (
    LAYOUT_GAIN_LARGE,
    LAYOUT_GAIN_MIN,
    LAYOUT_REPACKED_BYTES_MIN,
    LAYOUT_REPACKED_SHARE_MIN,
    LAYOUT_TIGHT_SHARE,
)

MIB = 1 << 20


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
        copies = processes * (on.anon_bytes or 0)
        if room is not None and copies > room:
            return None  # neither is known to run here within the memory: the rule decides
        return RepackChoice(True, f"on: the unrepacked layout failed its trial ({off.failed})")
    extra = (on.anon_bytes or 0) - (off.anon_bytes or 0)
    if extra < max(LAYOUT_REPACKED_BYTES_MIN, LAYOUT_REPACKED_SHARE_MIN * model_bytes):
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
    tight = room is not None and copies > room * LAYOUT_TIGHT_SHARE
    if tight and (gain < LAYOUT_GAIN_LARGE or copies > (room or 0)):
        return RepackChoice(
            False,
            f"off: {seen}, but {processes} repacked copies ({copies / MIB:.0f} MiB) would "
            f"take over {LAYOUT_TIGHT_SHARE:.0%} of the {(room or 0) / MIB:.0f} MiB left; one "
            "shared copy instead",
        )
    return RepackChoice(
        True,
        f"on: {seen}; each of {processes} processes holds its own copy ({extra / MIB:.0f} MiB)",
    )


async def measured_runs(
    model: Path, threads: int, backend_dir: Path | None = None, **probe_args: Any
) -> tuple[LayoutRun, LayoutRun, bool]:
    """(off, on, cached): from the cache file, else measured now (unrepacked first) and kept
    where what it found holds for this machine: both measured, or a layout crashed."""
    folder = cache_dir()
    path = folder / f"{cache_key(model, threads, backend_dir)}.json" if folder else None
    hit = read_cached(path) if path else None
    if hit is not None:
        return hit[0], hit[1], True
    # One after the other: side by side, each would take the other's cores.
    off = await probe(model, threads, False, backend_dir, **probe_args)
    on = await probe(model, threads, True, backend_dir, **probe_args)
    lasting = all(r.failed is None or r.lasting for r in (off, on))
    if path and lasting and not (off.failed and on.failed):
        write_cached(path, off, on)
    return off, on, False


async def resolve(
    settings: Settings,
    threads: int,
    processes: int,
    room: int | None,
    chat: bool | None = None,
    **probe_args: Any,
) -> Layout:
    """SEMIF_REPACK for this start: as set, the rule (a GPU, nothing measured), or measured.
    `chat`: whether generation speed counts (None: settings.chat)."""
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
        chat=settings.chat if chat is None else chat,
    )
    seconds = time.perf_counter() - start
    if choice is None:
        rule = repack_choice(settings.repack)
        why = f"{rule.why} (no layout is known to run here: off {off.failed}; on " + (
            f"{on.failed})" if on.failed else "would not fit in the memory left)"
        )
        return Layout(RepackChoice(rule.on, why), (off, on), cached, seconds)
    return Layout(choice, (off, on), cached, seconds)
