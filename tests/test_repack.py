"""Weight repacking (SEMIF_REPACK, alias SM_LLAMA_CPP_REPACK): one choice for the engine and
every llama-server. Repacked, ggml's CPU backend keeps a private copy of the weights in its
interleaved layouts in each process; unrepacked, they all read the one mmap'ed file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from semif_proxy.engine.questions import Question
from semif_proxy.engine.worker import DecisionEngine
from semif_proxy.llama_server.args import with_defaults
from semif_proxy.settings import SettingsError, load_settings, repack_choice
from semif_proxy.testing.server import wait_for
from tests.conftest import StartProxy, engine_settings

INTEL_AMX = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\n"
    "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 "
    "amx_tile amx_int8\n"
)
AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c\n"
AVX512 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512_vnni\n"
ARM = "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd evtstrm aes sha2 asimddp i8mm\n"
QWEN_CACHE = Path.home() / ".cache" / "semif-proxy" / "models"


# -- the setting --------------------------------------------------------------------------------


def test_the_setting_defaults_to_auto(model_path: Path) -> None:
    assert load_settings({"SEMIF_CHAT": "off"}, model=str(model_path)).repack == "auto"


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"SEMIF_REPACK": "on"}, "on"),
        ({"SEMIF_REPACK": "OFF"}, "off"),
        ({"SEMIF_REPACK": "auto"}, "auto"),
        ({"SM_LLAMA_CPP_REPACK": "off"}, "off"),
        # llama-server's switch words, as its users write them
        ({"SM_LLAMA_CPP_REPACK": "false"}, "off"),
        ({"SM_LLAMA_CPP_REPACK": "1"}, "on"),
        ({"SEMIF_REPACK": "on", "SM_LLAMA_CPP_REPACK": "off"}, "on"),  # the first name wins
    ],
)
def test_the_setting_and_its_alias(model_path: Path, env: dict[str, str], want: str) -> None:
    assert load_settings({"SEMIF_CHAT": "off", **env}, model=str(model_path)).repack == want


@pytest.mark.parametrize("var", ["SEMIF_REPACK", "SM_LLAMA_CPP_REPACK"])
def test_a_bad_value_names_the_variable(model_path: Path, var: str) -> None:
    with pytest.raises(SettingsError, match=rf"^{var}: .*'auto', 'on' or 'off'"):
        load_settings({"SEMIF_CHAT": "off", var: "fast"}, model=str(model_path))


def test_the_alias_is_the_proxys_not_a_raw_llama_server_flag(model_path: Path) -> None:
    """Read by settings/env.py and never forwarded as `--repack off`; llama-server's own spellings
    of the switch are refused with the setting to use instead (the engine must load alike)."""
    settings = load_settings({"SM_LLAMA_CPP_REPACK": "off"}, model=str(model_path))
    assert settings.repack == "off" and settings.llama_server_args == ()
    for var in ("SM_LLAMA_CPP_NO_REPACK", "SM_LLAMA_CPP_NR"):
        with pytest.raises(SettingsError, match=rf"^{var}: .*SEMIF_REPACK"):
            load_settings({var: "true"}, model=str(model_path))


# -- auto --------------------------------------------------------------------------------------


def test_auto_is_off_even_with_amx() -> None:
    """The base image's llama-server died of SIGILL with repacking on a Xeon with AMX and ran
    without it (tests/test_base_image.py serves on exactly that build)."""
    choice = repack_choice("auto", INTEL_AMX)
    assert not choice.on and "AMX (amx_int8, amx_tile)" in choice.why and "SIGILL" in choice.why


@pytest.mark.parametrize(("cpuinfo", "simd"), [(AVX2, "AVX2"), (AVX512, "AVX-512")])
def test_auto_is_off_without_amx(cpuinfo: str, simd: str) -> None:
    choice = repack_choice("auto", cpuinfo)
    assert not choice.on
    assert choice.why.startswith(f"off: {simd} without AMX") and "one copy" in choice.why


def test_auto_keeps_llama_cpps_default_where_it_was_not_measured() -> None:
    assert repack_choice("auto", ARM).on  # NEON/i8mm repacked kernels: not measured here
    assert repack_choice("auto", "").on


def test_on_and_off_are_obeyed_whatever_the_cpu() -> None:
    for cpuinfo in (INTEL_AMX, AVX2, ARM):
        assert repack_choice("on", cpuinfo).on and not repack_choice("off", cpuinfo).on


def test_auto_reads_this_machines_cpuinfo() -> None:
    text = Path("/proc/cpuinfo").read_text()
    assert repack_choice("auto") == repack_choice("auto", text)


# -- llama-server's argv ---------------------------------------------------------------------


def test_llama_server_gets_no_repack_exactly_when_off() -> None:
    assert "--no-repack" not in with_defaults([], 2)  # other callers: llama.cpp's default
    assert "--no-repack" not in with_defaults(["--ctx-size", "4096"], 2, repack=True)
    off = with_defaults(["--ctx-size", "4096"], 2, repack=False)
    assert off.count("--no-repack") == 1 and off[:2] == ["--ctx-size", "4096"]
    assert with_defaults(["--no-repack"], None, repack=False).count("--no-repack") == 1


# -- the engine --------------------------------------------------------------------------------


def _questions() -> list[Question]:
    state = "Order 4471 left the Leipzig warehouse on Monday; tracking shows the regional hub. " * 6
    return [
        Question(
            path="decision",
            id="letters",
            state=state,
            question="Where is the parcel?",
            descriptions=("at the regional hub", "delivered", "lost", "returned"),
        ),
        Question(
            path="decision",
            id="numbers",
            state=state,
            question="Which depot handles it?",
            descriptions=tuple(f"depot {i}" for i in range(30)),  # numbered labels
        ),
    ]


def _both(model: Path) -> Iterator[tuple[str, DecisionEngine]]:
    for flag in ("on", "off"):
        engine = DecisionEngine.load(engine_settings(model, repack=flag))
        try:
            yield flag, engine
        finally:
            engine.close()


def _scores(model: Path) -> dict[str, list]:
    out = {}
    for flag, engine in _both(model):
        assert engine.model_info["repack"]["on"] is (flag == "on")
        assert engine.model_info["repack"]["setting"] == flag
        assert engine.unavailable_reason is None  # the exactness self-check passed
        out[flag] = engine.evaluate(_questions()).scored
    return out


def test_the_engine_gives_the_same_bits_either_way_on_smollm2(model_path: Path) -> None:
    """SmolLM2's Q4_1 weights have no repacked layout: both loads run the same kernels."""
    scores = _scores(model_path)
    for on, off in zip(scores["on"], scores["off"], strict=True):
        np.testing.assert_array_equal(on.option_logits, off.option_logits)
        np.testing.assert_array_equal(on.probabilities, off.probabilities)
        assert on.allowed_token_mass == off.allowed_token_mass


def _qwen() -> Path:
    wanted = os.environ.get("SEMIF_TEST_QWEN")
    path = Path(wanted) if wanted else QWEN_CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if not path.is_file():
        pytest.skip("no Qwen2.5 model (SEMIF_TEST_QWEN, or the cache's 0.5B)")
    return path


@pytest.mark.slow
def test_on_qwen_the_two_layouts_agree_within_a_tolerance() -> None:
    """Q4_K/Q6_K weights are repacked for other kernels (AVX2 and up), whose sums run in
    another order: not a bit-exact pair. Found (AVX-512, 2 cores), on vs off, for these two
    questions: Qwen2.5-Coder-0.5B letter logits 0.06 apart, numbered log-probabilities 0.12,
    probabilities at most 0.007, the same answers; 1.5B: 0.03, 0.26 and 0.021, and its
    30-option question (a near tie) changed its top answer."""
    scores = _scores(_qwen())
    for on, off in zip(scores["on"], scores["off"], strict=True):
        np.testing.assert_allclose(on.option_logits, off.option_logits, atol=0.2, rtol=0)
        np.testing.assert_allclose(on.probabilities, off.probabilities, atol=0.015, rtol=0)
        top, second = np.sort(on.probabilities)[::-1][:2]
        if top - second > 0.05:  # no near tie: the same answer
            assert int(np.argmax(on.probabilities)) == int(np.argmax(off.probabilities))


# -- a real server -----------------------------------------------------------------------------


def _llama_servers(pid: int) -> list[tuple[int, list[str]]]:
    """The proxy's llama-server children and their argv (/proc/PID/task/*/children)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in (task / "children").read_text().split():
            argv = Path(f"/proc/{child}/cmdline").read_bytes().decode().split("\0")[:-1]
            if argv and Path(argv[0]).name == "llama-server":
                found.append((int(child), argv))
    return found


def test_a_server_with_repack_off_says_so_and_starts_llama_server_without(
    model_path: Path, start_proxy: StartProxy
) -> None:
    # The product's threads: CPU sharing dynamic with its second llama-server.
    server = start_proxy(
        model_path, {"SEMIF_REPACK": "off", "SEMIF_CPU_SHARING": "dynamic"}, preset="defaults"
    )
    health = server.call("GET", "/health").json()
    assert health["model"]["repack"] == {
        "on": False,
        "setting": "off",
        "why": "off: as set (SEMIF_REPACK)",
    }
    ready = [json.loads(x) for x in server.log_lines() if '"engine_ready"' in x]
    assert ready and ready[0]["repack"]["on"] is False

    # The second llama-server (dynamic) starts after /ping says 200: wait for it to settle.
    def split_state() -> str:
        return server.call("GET", "/health").json()["llama_server_split"]["state"]

    wait_for(lambda: split_state() in ("ready", "not started"), 180, "the second llama-server")
    health = server.call("GET", "/health").json()
    assert server.proc is not None
    servers = dict(_llama_servers(server.proc.pid))
    pids = [health["llama_server"]["pid"]]
    if health["llama_server_split"]["state"] == "ready":  # not started: memory too short
        pids.append(health["llama_server_split"]["pid"])
    assert set(pids) <= set(servers) and len(servers) == len(pids)
    for pid in pids:
        assert servers[pid].count("--no-repack") == 1, servers[pid]
