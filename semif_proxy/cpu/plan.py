"""How many cores this process may really use: its CPU affinity, capped by a cgroup CPU quota
(a container started with --cpus=2 on a 64-core host sees 64 in os.cpu_count(), but gets the
time of 2; threads beyond that only wait on each other)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def _quota_v2(root: Path) -> float | None:
    # cgroup v2: "max 100000" (no quota) or "200000 100000" (2 CPUs' worth).
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return int(quota) / int(period)


def _quota_v1(root: Path) -> float | None:
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def quota_cores(root: Path = CGROUP) -> float | None:
    """The cgroup's CPU quota in cores, or None when it sets none."""
    quota = _quota_v2(root)
    return quota if quota is not None else _quota_v1(root)


def available_cores(root: Path = CGROUP) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = quota_cores(root)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def _meminfo_available(meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room(root: Path) -> int | None:
    """What the cgroup's memory limit still allows (v2, then v1); None without a limit. Its
    usage counts page cache too; the inactive file pages (a GGUF read before) are reclaimable,
    so they are left out, as the kernel's MemAvailable leaves them out."""
    for limit_file, usage_file, inactive_key in (
        ("memory.max", "memory.current", "inactive_file"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "total_inactive_file"),
    ):
        try:
            limit = (root / limit_file).read_text().strip()
            usage = int((root / usage_file).read_text().strip())
            if limit == "max" or int(limit) >= 1 << 60:  # v1 writes "no limit" as ~2^63
                return None
            stat = (root / limit_file).with_name("memory.stat")
            inactive = 0
            if stat.exists():
                for line in stat.read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == inactive_key:
                        inactive = int(value)
            return max(0, int(limit) - (usage - inactive))
        except (OSError, ValueError):
            continue
    return None


def memory_room(root: Path = CGROUP, meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Bytes this process tree may still take: the kernel's MemAvailable, capped by what a
    cgroup memory limit (a container's --memory) leaves. None when neither can be read."""
    known = [v for v in (_meminfo_available(meminfo), _cgroup_room(root)) if v is not None]
    return min(known) if known else None


def private_bytes(pid: int) -> int | None:
    """What a process holds of its own (not shared file pages): Private_Clean + _Dirty."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    total = 0
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Private_Clean", "Private_Dirty"):
            total += int(rest.split()[0]) * 1024
    return total


def second_server_fits(room: int | None, first_private: int | None) -> bool:
    """A second llama-server holds what the first holds of its own (measured, not estimated):
    its KV cache and buffers, and with weight repacking on (SEMIF_REPACK) its own copy of the
    weights in the CPU backend's layouts; off, the weights stay in the shared file pages
    (Qwen2.5-1.5B Q4_K_M at 4,096 tokens: 780 MiB repacked, 185 MiB not; docs/memory.md).
    Started only where that and half again as a margin fit."""
    if room is None or first_private is None:
        return True
    return room >= first_private * 3 // 2


@dataclass(frozen=True)
class ThreadPlan:
    """Who gets which cores (the policy that keeps to it: policy.py). `gate`: both use every
    core and one job runs at a time; `dynamic`: alone, each uses every core; while both have
    work, the cores are divided: the engine drops to `engine_split` threads and chat goes to a
    second llama-server started with `llama_server_split` (dynamic.py); `split`: the cores
    are divided between the two, both run at once; `none`: both use every core, unguarded (GPU
    offload: the cores mostly wait)."""

    sharing: str
    engine: int
    llama_server: int | None  # None: the operator set llama-server's threads itself
    engine_split: int = 0  # dynamic: the engine's threads while the split llama-server runs
    llama_server_split: int = 0  # dynamic: the second llama-server's threads
    why: str = ""  # why `dynamic` became the gate (logged at start, in /health)


def plan_threads(
    sharing: str,
    n_threads: int,
    n_gpu_layers: int,
    chat: bool,
    decisions: bool,
    llama_server_args: tuple[str, ...],
    cores: int | None = None,
    second_server: bool = True,
) -> ThreadPlan:
    cores = cores or available_cores()
    flags = {a.split("=", 1)[0] for a in llama_server_args}
    operator_threads = bool(flags & {"--threads", "-t"})
    # A batch thread count of the operator's would run the split server's prompts on them all.
    operator_any = operator_threads or bool(flags & {"--threads-batch", "-tb"})
    if sharing == "auto":
        # Measured (bench mixed, README): alone, each path as fast as the gate; under mixed
        # load more of both done than with a static split. Falls back to the gate below.
        both_on_cpu = chat and decisions and n_gpu_layers == 0
        sharing = "dynamic" if both_on_cpu else "none"
    why = ""
    if sharing == "dynamic":
        # Nothing to divide (one core, one path), llama-server's threads are the operator's,
        # the model is on a GPU (a second server would hold a second copy there), or no port
        # is left for a second server: one job at a time keeps each at full speed.
        reasons = (
            (cores < 2, f"{cores} core"),
            (not (chat and decisions), "one path is off"),
            (operator_any, "llama-server's threads are set in its arguments"),
            (n_gpu_layers != 0, "layers are offloaded to a GPU"),
            (not second_server, "no port for a second llama-server"),
        )
        why = "; ".join(text for hit, text in reasons if hit)
        if why:
            sharing = "gate"
    if n_threads:
        engine = n_threads
    elif sharing == "split" and chat:
        engine = max(1, cores // 2)
    else:
        engine = cores
    server: int | None
    if operator_threads:
        server = None
    elif sharing == "split" and decisions:
        server = max(1, cores - engine)
    else:
        server = cores
    if sharing != "dynamic":
        return ThreadPlan(sharing, engine, server, why=why)
    server_split = cores // 2
    return ThreadPlan(sharing, engine, server, min(engine, cores - server_split), server_split)
