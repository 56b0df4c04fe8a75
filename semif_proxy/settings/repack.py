"""SEMIF_REPACK's rule: the weights' layout that the engine and every llama-server obey
together where it is not measured. `auto` is measured at start-up (engine/layout.py); this rule
decides with layers on a GPU, and where neither layout could be measured."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple


class RepackChoice(NamedTuple):
    on: bool
    why: str


# Off on every x86 CPU. Without AMX, on a 2-core AVX-512 EPYC, the unrepacked layout prefilled
# Qwen2.5-1.5B Q4_K_M 1.25x faster and 0.5B as fast (bench/results/repack-*.json), and every
# process then shares one copy of the weights (memory-*.json: the default server's three
# processes 3,484 -> 1,701 MiB PSS on 1.5B). With AMX (the flags below), llama.cpp's AMX kernels
# run only on repacked buffers, but on a Xeon VM with amx_int8/amx_tile (the kernel granting
# AMX state) the base image's llama-server (b11312, every CPU variant, its sapphirerapids
# backend picked) died of SIGILL at its first decode with repacking on, and ran with
# --no-repack (tests/test_base_image.py starts exactly that server): a layout that can kill
# the server is not chosen for anyone; SEMIF_REPACK=on stays for those who measured it.
AMX_FLAGS = frozenset({"amx_int8", "amx_tile"})


def repack_choice(setting: str, cpuinfo: str | None = None) -> RepackChoice:
    """SEMIF_REPACK resolved for this machine (cpuinfo: /proc/cpuinfo's text, read when None).
    auto: off on every x86 CPU (AMX included, see above); llama.cpp's default (on) where
    /proc/cpuinfo shows no x86 flags (ARM's NEON/i8mm repacked kernels were not measured here)."""
    if setting in ("on", "off"):
        return RepackChoice(setting == "on", f"{setting}: as set (SEMIF_REPACK)")
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == "flags":
            flags.update(rest.split())
    if not flags:
        return RepackChoice(
            True, "on: no x86 CPU flags in /proc/cpuinfo: llama.cpp's default (not measured here)"
        )
    amx = sorted(flags & AMX_FLAGS)
    if amx:
        return RepackChoice(
            False,
            f"off: AMX ({', '.join(amx)}) present, but llama.cpp's repacked AMX kernels died of "
            "SIGILL on such a CPU where the unrepacked layout ran (settings/repack.py); every "
            "process shares one copy of the weights",
        )
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "x86"
    return RepackChoice(
        False,
        f"off: {simd} without AMX: the unrepacked layout prefilled Qwen2.5-1.5B Q4_K_M 1.25x "
        "faster on a 2-core AVX-512 EPYC (bench/results/repack-*.json), and every process "
        "shares one copy of the weights",
    )
