"""One layout of the weights tried in a throw-away child (layout_probe.py) for
SEMIF_REPACK=auto: started like a llama-server child, killed with the server or at the timeout,
its crash, error or silence the trial's `failed`, and a crash in the kernels (SIGILL and the
like) marked as lasting: it holds for every start on this machine."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from semif_proxy.llama_server.child import die_with_parent
from semif_proxy.settings.defaults import LAYOUT_PROBE_TIMEOUT_S

# -P: the working directory is not put on sys.path (a checkout there is not what is measured).
PROBE_COMMAND = (sys.executable, "-P", "-m", "semif_proxy.engine.layout_probe")
# A child killed by one of these crashed in its kernels: that result holds for every start on
# this machine and is kept. Any other death (SIGKILL by the OOM killer, a SIGTERM or SIGINT
# meant for the server) says nothing about the layout and is not kept.
CRASH_SIGNALS = frozenset({signal.SIGILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE})


@dataclass(frozen=True)
class LayoutRun:
    """One child's measurement of one layout; `failed` says why it has none."""

    repack: bool
    failed: str | None = None
    # The failure holds for this machine (a crash in the kernels), not for this start only.
    lasting: bool = False
    prefill_tokens_per_s: float | None = None
    generate_tokens_per_s: float | None = None
    anon_bytes: int | None = None
    load_seconds: float | None = None


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
        # Like a llama-server child: killed if the server dies, no stdin. Its own session: a
        # Ctrl-C meant for the server does not kill it (and poison its result); the server's
        # shutdown cancels the probe, which kills it.
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=die_with_parent,
            start_new_session=True,
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
        crashed = -proc.returncode in CRASH_SIGNALS
        return LayoutRun(
            repack, failed=f"its process died of signal {-proc.returncode}", lasting=crashed
        )
    if proc.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return LayoutRun(repack, failed=f"exit {proc.returncode}: {last[:200]}")
    try:
        row = json.loads(out.decode(errors="replace").strip().splitlines()[-1])
        return run_from(repack, row)
    except (IndexError, ValueError):
        return LayoutRun(repack, failed="no measurement in its output")


def _number(value: object, integer: bool = False) -> float | int | None:
    if value is None:
        return None
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value < 0:  # type: ignore[arg-type]
        raise ValueError(f"not a measurement: {value!r}")
    return value  # type: ignore[return-value]


def run_from(repack: bool, row: object) -> LayoutRun:
    """A child's JSON line, checked (ValueError: not a measurement)."""
    if not isinstance(row, dict):
        raise ValueError("not an object")
    prefill = _number(row.get("prefill_tokens_per_s"))
    if not prefill:
        raise ValueError("no prefill rate")
    return LayoutRun(
        repack,
        prefill_tokens_per_s=prefill,
        generate_tokens_per_s=_number(row.get("generate_tokens_per_s")),
        anon_bytes=_number(row.get("anon_bytes"), integer=True),  # type: ignore[arg-type]
        load_seconds=_number(row.get("load_seconds")),
    )
