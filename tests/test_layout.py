"""SEMIF_REPACK=auto measured on the machine it runs on (engine/layout.py): both layouts timed in
throw-away children of the real engine, a crash or a silent child disqualifying a layout, the
measurement kept per build, model, CPU and threads, and one choice for every process."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from semif_proxy.engine.layout import MIB, decide, measured_runs
from semif_proxy.engine.layout_cache import cache_dir
from semif_proxy.engine.layout_trial import PROBE_COMMAND, LayoutRun, probe
from semif_proxy.settings.defaults import LAYOUT_GAIN_LARGE, LAYOUT_GAIN_MIN
from semif_proxy.testing.server import wait_for
from tests.conftest import StartProxy
from tests.test_repack import QWEN_CACHE, _llama_servers

GIB = 1 << 30


def _run(repack: bool, prefill: float, generate: float | None, anon_mib: float) -> LayoutRun:
    return LayoutRun(
        repack,
        prefill_tokens_per_s=prefill,
        generate_tokens_per_s=generate,
        anon_bytes=int(anon_mib * MIB),
        load_seconds=1.0,
    )


# -- the choice from two measurements -------------------------------------------------------------


def _decide(off: LayoutRun, on: LayoutRun, room: int | None = 20 * GIB, chat: bool = True):
    return decide(off, on, model_bytes=1000 * MIB, processes=3, room=room, chat=chat)


def test_a_layout_that_failed_is_never_chosen() -> None:
    good_off, good_on = _run(False, 40, 10, 50), _run(True, 80, 20, 800)
    choice = _decide(good_off, LayoutRun(True, failed="its process died of signal 4"))
    assert choice is not None and not choice.on and "signal 4" in choice.why
    choice = _decide(LayoutRun(False, failed="exit 1: boom"), good_on)
    assert choice is not None and choice.on and "exit 1: boom" in choice.why
    # ... unless its copies (3 x 800 MiB here) would not fit: then nothing is known to run.
    assert _decide(LayoutRun(False, failed="exit 1: boom"), good_on, room=2 * GIB) is None
    assert _decide(LayoutRun(False, failed="x"), LayoutRun(True, failed="y")) is None


def test_a_model_with_nothing_repacked_stays_shared_however_the_timings_fall() -> None:
    """SmolLM2's Q4_1 has no repacked layout: the two children ran the same kernels, and a
    noisy 1.3x 'gain' is noise."""
    choice = _decide(_run(False, 40, 10, 50), _run(True, 52, 13, 51))
    assert choice is not None and not choice.on and "nothing of this model" in choice.why


@pytest.mark.parametrize(
    ("prefill", "generate", "chat", "on"),
    [
        (1.04, 1.04, True, False),  # within the noise: one shared copy wins
        (1.04, 1.36, True, True),  # chat generates 1.36x faster repacked (the AMX Xeon here)
        (1.04, 1.36, False, False),  # ... but with chat off only prefill counts
        (1.25, None, False, True),
        (0.80, 0.90, True, False),  # unrepacked faster (the AVX2/AVX-512 machines measured)
        (0.85, 1.36, True, False),  # chat faster, decisions slower: no loss of either
    ],
)
def test_repacked_only_where_it_is_measurably_faster(
    prefill: float, generate: float | None, chat: bool, on: bool
) -> None:
    off = _run(False, 40.0, 10.0, 50)
    rep = _run(True, 40.0 * prefill, None if generate is None else 10.0 * generate, 800)
    choice = _decide(off, rep, chat=chat)
    assert choice is not None and choice.on is on, choice
    assert f"prefill {prefill:.2f}x" in choice.why


def test_where_memory_is_tight_only_a_large_gain_buys_the_copies() -> None:
    off, rep = _run(False, 40, 10, 50), _run(True, 40 * 1.3, 13, 800)  # 3 x 750 MiB of copies
    assert LAYOUT_GAIN_MIN < 1.3 < LAYOUT_GAIN_LARGE
    roomy = _decide(off, rep, room=20 * GIB)
    tight = _decide(off, rep, room=4 * GIB)  # the copies would take over half
    assert roomy is not None and roomy.on
    assert tight is not None and not tight.on and "over 50% of the 4096 MiB" in tight.why
    fast = _run(True, 40 * 2.0, 20, 800)
    assert _decide(off, fast, room=4 * GIB).on  # type: ignore[union-attr]
    assert not _decide(off, fast, room=2 * GIB).on  # type: ignore[union-attr]  # cannot fit
    assert _decide(off, rep, room=None).on  # type: ignore[union-attr]  # unknown: not tight


# -- the throw-away children ---------------------------------------------------------------------


def test_both_layouts_of_the_default_model_are_timed_in_children(model_path: Path) -> None:
    """Through the run's kept measurements: a server of this run on one thread (the test
    servers') measured the same, or this measures it for them."""
    off, on, _ = asyncio.run(measured_runs(model_path, 1))
    for run in (off, on):
        assert run.failed is None, run
        assert run.prefill_tokens_per_s and run.prefill_tokens_per_s > 1
        assert run.generate_tokens_per_s and run.generate_tokens_per_s > 1
        assert run.anon_bytes is not None and run.anon_bytes > 0
    # SmolLM2's Q4_1 tensors have no repacked layout: no copy of its own either way.
    assert abs((on.anon_bytes or 0) - (off.anon_bytes or 0)) < 16 * MIB
    choice = decide(
        off, on, model_bytes=model_path.stat().st_size, processes=3, room=None, chat=True
    )
    assert choice is not None and not choice.on


def _repacked_copy(model: Path) -> int:
    off = asyncio.run(probe(model, 2, False))
    on = asyncio.run(probe(model, 2, True))
    assert off.failed is None and on.failed is None
    return (on.anon_bytes or 0) - (off.anon_bytes or 0)


@pytest.mark.slow  # make test-qwen (CI runs it)
def test_a_repacked_qwen_holds_a_copy_of_its_own() -> None:
    """Q4_K weights have repacked layouts (AVX2 and up): the repacked child holds a copy in
    anonymous memory, the unrepacked one reads the mmap'ed file. The 0.5B repacks little (its
    896-wide rows fall back to types without such a layout): 28 MiB on an AMX Xeon."""
    model = QWEN_CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if not model.is_file():
        pytest.skip("no Qwen2.5-0.5B in the cache")
    assert _repacked_copy(model) > 16 * MIB


@pytest.mark.slow
def test_a_repacked_qwen_15b_holds_most_of_the_file_again() -> None:
    """Qwen2.5-1.5B: 765 MiB private in a repacked llama-server against 169 MiB unrepacked (the
    issue's figure); 597 MiB more in the repacked child on an AMX Xeon."""
    model = QWEN_CACHE / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    if not model.is_file():
        pytest.skip("no Qwen2.5-1.5B in the cache (make model-qwen15)")
    assert _repacked_copy(model) > 0.4 * model.stat().st_size


@pytest.fixture
def crashing_repack(tmp_path: Path) -> tuple[str, ...]:
    """A probe whose repacked child dies of SIGILL, as the base image's AMX kernels did."""
    script = tmp_path / "probe.sh"
    script.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" --repack on "*) kill -ILL $$;; esac\n'
        f'exec "{sys.executable}" -m semif_proxy.engine.layout_probe "$@"\n'
    )
    script.chmod(0o755)
    return (str(script),)


def test_a_child_that_dies_disqualifies_its_layout(
    tiny_model: Path, crashing_repack: tuple[str, ...]
) -> None:
    on = asyncio.run(probe(tiny_model, 1, True, command=crashing_repack))
    off = asyncio.run(probe(tiny_model, 1, False, command=crashing_repack))
    assert on.failed == "its process died of signal 4"
    assert off.failed is None
    choice = decide(off, on, model_bytes=1, processes=1, room=None, chat=True)
    assert choice is not None and not choice.on and "signal 4" in choice.why


def _running(argv: list[bytes]) -> list[int]:
    """The processes whose argv starts with `argv`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (proc / "cmdline").read_bytes().split(b"\0")[: len(argv)] == argv:
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def test_a_silent_child_is_killed_at_the_timeout(model_path: Path, tmp_path: Path) -> None:
    token = f"{os.getpid()}.{time.monotonic_ns() % 10**6}"  # this test's own sleep
    script = tmp_path / "stall.sh"
    script.write_text(f"#!/bin/sh\nexec sleep {token}\n")
    script.chmod(0o755)
    start = time.monotonic()
    run = asyncio.run(probe(model_path, 1, False, command=(str(script),), timeout=1.0))
    assert run.failed == "no answer within 1 s" and not run.lasting
    assert time.monotonic() - start < 10
    assert not _running([b"sleep", token.encode()])


def test_output_that_is_no_measurement_fails_the_trial(model_path: Path, tmp_path: Path) -> None:
    for line in ("[1, 2]", '{"prefill_tokens_per_s": "fast"}', '{"prefill_tokens_per_s": -1}'):
        script = tmp_path / "odd.sh"
        script.write_text(f"#!/bin/sh\necho '{line}'\n")
        script.chmod(0o755)
        run = asyncio.run(probe(model_path, 1, False, command=(str(script),)))
        assert run.failed == "no measurement in its output", line


def test_the_measurement_is_kept_per_model_file(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    shutil.copy(tiny_model, model)
    off, on, cached = asyncio.run(measured_runs(model, 1))
    assert not cached and off.failed is None and on.failed is None
    folder = cache_dir()
    assert folder is not None
    [kept] = list(folder.glob("*.json"))
    assert json.loads(kept.read_text())["off"]["prefill_tokens_per_s"] == off.prefill_tokens_per_s
    again = asyncio.run(measured_runs(model, 1, command=("false",)))  # would fail if run
    assert again == (off, on, True)
    os.utime(model, ns=(time.time_ns(), time.time_ns() + 10**9))  # another file: measured
    assert asyncio.run(measured_runs(model, 1))[2] is False
    assert asyncio.run(measured_runs(model, 2))[2] is False  # another thread count
    assert len(list(folder.glob("*.json"))) == 3
    kept.write_text('{"off": {"prefill_tokens_per_s": "x"}, "on": []}')  # not ours: a miss
    os.utime(model, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    assert asyncio.run(measured_runs(model, 1))[2] is False


def test_nothing_is_kept_when_neither_layout_ran(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    off, on, _ = asyncio.run(measured_runs(tiny_model, 1, command=("false",)))
    assert off.failed == "exit 1: no output" and on.failed == off.failed
    folder = cache_dir()
    assert folder is not None and not folder.exists()


def test_a_crash_is_kept_and_a_passing_failure_is_not(
    tiny_model: Path,
    crashing_repack: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGILL in the repacked kernels holds for this machine: kept, and read back as the same
    failure. A timeout (or a child killed by the OOM killer or a stop) says nothing about the
    layout: measured again at the next start."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    off, on, cached = asyncio.run(measured_runs(tiny_model, 1, command=crashing_repack))
    assert not cached and off.failed is None and on.lasting
    again = asyncio.run(measured_runs(tiny_model, 1, command=("false",)))
    assert again == (off, on, True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other"))
    slow = asyncio.run(measured_runs(tiny_model, 1, timeout=0.01))
    assert slow[0].failed == slow[1].failed == "no answer within 0 s"
    assert not (tmp_path / "other").exists()


def test_without_a_home_it_measures_and_keeps_nothing(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An arbitrary uid without a passwd entry and no HOME: Path.home() fails."""

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert cache_dir() is None
    off, on, cached = asyncio.run(measured_runs(tiny_model, 1))
    assert off.failed is None and on.failed is None and not cached


def test_the_probe_command_is_the_installed_module() -> None:
    assert PROBE_COMMAND[1:] == ("-P", "-m", "semif_proxy.engine.layout_probe")


# -- as served ------------------------------------------------------------------------------------


def test_a_default_server_measures_once_and_every_process_obeys(
    model_path: Path, start_proxy: StartProxy, tmp_path: Path
) -> None:
    """Default settings (CPU sharing dynamic, SEMIF_REPACK=auto): the layout is measured before
    the engine loads, said in the log and /health, obeyed by the engine and every
    llama-server; a restart on the same machine reads the kept measurement."""
    env = {
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "SEMIF_CPU_SHARING": "dynamic",
        "SEMIF_N_GPU_LAYERS": "0",  # measured on the CPU only (with GPU layers: the rule)
    }
    server = start_proxy(model_path, env, preset="defaults")
    lines = [json.loads(x) for x in server.log_lines() if x.startswith("{")]
    events = [x.get("event") for x in lines]
    assert events.index("weights_layout") < events.index("engine_ready")
    [said] = [x for x in lines if x.get("event") == "weights_layout"]
    repack = server.call("GET", "/health").json()["model"]["repack"]
    assert repack["setting"] == "auto" and repack["cached"] is False
    assert set(repack["measured"]) == {"on", "off"}
    assert repack["on"] == said["on"] and repack["why"] == said["why"]
    if "SmolLM2" in model_path.name:  # Q4_1: no repacked layout
        assert repack["on"] is False and "nothing of this model" in repack["why"]
    assert server.proc is not None
    for _pid, argv in _llama_servers(server.proc.pid):
        assert argv.count("--no-repack") == 1, argv
    server.stop()
    again = start_proxy(model_path, env, preset="defaults")
    kept = again.call("GET", "/health").json()["model"]["repack"]
    assert kept["cached"] is True and kept["measured"] == repack["measured"]


def test_a_server_stopped_while_measuring_exits_and_leaves_no_child(
    model_path: Path, start_proxy: StartProxy, tmp_path: Path
) -> None:
    """SIGTERM while a layout's child is running: the child is killed, nothing is kept or
    loaded, and the server exits 0 at once (not after both trials and an engine load)."""
    cache = tmp_path / "cache"
    server = start_proxy(
        model_path, {"XDG_CACHE_HOME": str(cache), "SEMIF_N_GPU_LAYERS": "0"}, launch=True
    )
    assert server.proc is not None
    probe_argv = [sys.executable.encode(), b"-P", b"-m", b"semif_proxy.engine.layout_probe"]

    def probing() -> list[int]:
        return [p for p in _running(probe_argv) if _parent(p) == server.proc.pid]  # type: ignore[union-attr]

    wait_for(lambda: bool(probing()), 60, "a layout's child")
    children = probing()
    start = time.monotonic()
    assert server.stop(timeout=20) == 0
    assert time.monotonic() - start < 10
    assert not [p for p in children if Path(f"/proc/{p}").exists()]
    events = [json.loads(x).get("event") for x in server.log_lines() if x.startswith("{")]
    assert "engine_ready" not in events and "llama_server_start" not in events
    assert not list(cache.rglob("*.json"))


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
