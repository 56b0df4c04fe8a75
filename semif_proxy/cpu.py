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


@dataclass(frozen=True)
class ThreadPlan:
    """Who gets which cores. `slice`: the engine and llama-server both use every core and
    take turns while both have work (cpu_slicer.py); `gate`: both use every core and the
    CPU gate runs one job at a time; `dynamic`: alone, each uses every core; while both have
    work, the cores are divided: the engine drops to `engine_split` threads and chat goes to a
    second llama-server started with `llama_server_split` (cpu_dynamic.py); `split`: the cores
    are divided between the two, both run at once; `none`: both use every core, unguarded (GPU
    offload: the cores mostly wait)."""

    sharing: str
    engine: int
    llama_server: int | None  # None: the operator set llama-server's threads itself
    engine_split: int = 0  # dynamic: the engine's threads while the split llama-server runs
    llama_server_split: int = 0  # dynamic: the second llama-server's threads


def plan_threads(
    sharing: str,
    n_threads: int,
    n_gpu_layers: int,
    chat: bool,
    decisions: bool,
    llama_server_args: tuple[str, ...],
    cores: int | None = None,
) -> ThreadPlan:
    cores = cores or available_cores()
    flags = {a.split("=", 1)[0] for a in llama_server_args}
    operator_threads = bool(flags & {"--threads", "-t"})
    # A batch thread count of the operator's would run the split server's prompts on them all.
    operator_any = operator_threads or bool(flags & {"--threads-batch", "-tb"})
    if sharing == "auto":
        both_on_cpu = chat and decisions and n_gpu_layers == 0
        sharing = "gate" if both_on_cpu else "none"
    if sharing == "dynamic" and (
        cores < 2 or operator_any or not (chat and decisions) or n_gpu_layers != 0
    ):
        # Nothing to divide (one core, one path), llama-server's threads are the operator's,
        # or the model is on a GPU (a second server would hold a second copy there): one job
        # at a time keeps each at full speed.
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
        return ThreadPlan(sharing, engine, server)
    server_split = cores // 2
    return ThreadPlan(sharing, engine, server, min(engine, cores - server_split), server_split)
