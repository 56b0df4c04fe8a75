"""SM_LLAMA_CPP_* -> llama-server argv, checked against the flags the binary itself lists in
--help: the parser on real and older help texts, the mapping, and the real llama-server started
by the real proxy with the mapped flags."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from semif_proxy.engine import native
from semif_proxy.llama_server.args import LlamaArgsError, env_to_args
from semif_proxy.llama_server.flags import FlagTable, parse_help, read_flags
from semif_proxy.settings import SettingsError, load_settings
from semif_proxy.testing.server import ProxyProcess, free_port

# The shape of an older llama-server --help (before --flash-attn took a value, when --no-mmap
# and --no-cont-batching were options of their own), as common/arg.cpp prints it.
OLD_HELP = """\
----- common params -----

-h,    --help, --usage                  print usage and exit
-t,    --threads N                      number of threads to use during generation (default: -1)
                                        (env: LLAMA_ARG_THREADS)
-c,    --ctx-size N                     size of the prompt context (default: 4096, 0 = loaded from model)
                                        (env: LLAMA_ARG_CTX_SIZE)
-fa,   --flash-attn                     enable Flash Attention (default: disabled)
                                        (env: LLAMA_ARG_FLASH_ATTN)
--no-mmap                               do not memory-map model (slower load but may reduce pageouts if not
                                        using mlock)
                                        (env: LLAMA_ARG_NO_MMAP)
-nkvo, --no-kv-offload                  disable KV offload
                                        (env: LLAMA_ARG_NO_KV_OFFLOAD)
-sm,   --split-mode {none,layer,row}    how to split the model across multiple GPUs, one of:
                                        - none: use one GPU only
-ngl,  --gpu-layers, --n-gpu-layers N   number of layers to store in VRAM
                                        (env: LLAMA_ARG_N_GPU_LAYERS)
-cb,   --cont-batching                  enable continuous batching (a.k.a dynamic batching) (default: enabled)
                                        (env: LLAMA_ARG_CONT_BATCHING)
-nocb, --no-cont-batching               disable continuous batching
                                        (env: LLAMA_ARG_NO_CONT_BATCHING)
--api-key KEY                           API key to use for authentication (default: none)
                                        (env: LLAMA_API_KEY)
"""  # noqa: E501


@pytest.fixture(scope="module")
def binary() -> Path:
    path = native.llama_server_path()
    assert path is not None and path.is_file()
    return path


@pytest.fixture(scope="module")
def real(binary: Path) -> FlagTable:
    return read_flags(binary)


def _touch(path: Path) -> Path:
    path.write_bytes(b"GGUF")
    return path


# -- the parser ---------------------------------------------------------------------------------


def test_parser_reads_the_real_help(real: FlagTable) -> None:
    fa = real.get("--flash-attn")
    assert fa is real.get("-fa") and fa.values == 1 and fa.choices == ("on", "off", "auto")
    assert real.get("-c") is real.get("--ctx-size") and real.get("-c").values == 1
    assert real.get("-ngl") is real.get("--n-gpu-layers") is real.get("--gpu-layers")
    assert real.get("-t").names == ("-t", "--threads")
    kvo = real.get("--kv-offload")
    assert kvo.values == 0 and kvo.names == ("-kvo", "--kv-offload")
    assert kvo.negations == ("-nkvo", "--no-kv-offload") and real.get("-nkvo") is kvo
    assert real.get("--no-slots") is real.get("--slots")
    assert real.get("--split-mode").choices == ("none", "layer", "row", "tensor")
    assert real.get("--cpu-strict").switch_values == ("1", "0")
    assert real.get("--control-vector-layer-range").values == 2
    assert real.get("--draft-max").removed
    assert real.get("--metrics").values == 0 and not real.get("--metrics").negations
    assert real.get("--no-flash-attn") is None and real.get("--c") is None


def test_parser_reads_an_older_help() -> None:
    old = parse_help(OLD_HELP)
    assert len(old.flags) == 11
    fa = old.get("-fa")
    assert fa.names == ("-fa", "--flash-attn") and fa.values == 0 and fa.choices is None
    assert old.get("--no-mmap").values == 0 and old.get("--no-mmap").negations == ()
    assert old.get("-nkvo").names == ("-nkvo", "--no-kv-offload")
    assert old.get("--cont-batching") is not old.get("--no-cont-batching")
    assert old.get("--split-mode").choices == ("none", "layer", "row")
    assert old.get("--api-key").values == 1
    assert "using mlock" in old.get("--no-mmap").help


# -- the mapping --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SM_LLAMA_CPP_FLASH_ATTN": "true"}, ["--flash-attn", "on"]),
        ({"SM_LLAMA_CPP_FLASH_ATTN": "TRUE"}, ["--flash-attn", "on"]),
        ({"SM_LLAMA_CPP_FLASH_ATTN": "off"}, ["--flash-attn", "off"]),
        ({"SM_LLAMA_CPP_FLASH_ATTN": "0"}, ["--flash-attn", "off"]),
        ({"SM_LLAMA_CPP_FLASH_ATTN": "auto"}, ["--flash-attn", "auto"]),
        ({"SM_LLAMA_CPP_FA": "yes"}, ["-fa", "on"]),
        ({"SM_LLAMA_CPP_C": "2048"}, ["-c", "2048"]),
        ({"SM_LLAMA_CPP_T": "2"}, ["-t", "2"]),
        ({"SM_LLAMA_CPP_NGL": "0"}, ["-ngl", "0"]),
        ({"SM_LLAMA_CPP_N_GPU_LAYERS": "999"}, ["--n-gpu-layers", "999"]),
        ({"SM_LLAMA_CPP_NO_KV_OFFLOAD": "true"}, ["--no-kv-offload"]),
        ({"SM_LLAMA_CPP_NO_KV_OFFLOAD": ""}, ["--no-kv-offload"]),
        ({"SM_LLAMA_CPP_NO_KV_OFFLOAD": "false"}, ["--kv-offload"]),
        ({"SM_LLAMA_CPP_KV_OFFLOAD": "off"}, ["--no-kv-offload"]),
        ({"SM_LLAMA_CPP_CONT_BATCHING": "false"}, ["--no-cont-batching"]),
        ({"SM_LLAMA_CPP_METRICS": "on"}, ["--metrics"]),
        ({"SM_LLAMA_CPP_METRICS": "false"}, []),
        ({"SM_LLAMA_CPP_EMBEDDINGS": "False"}, []),
        ({"SM_LLAMA_CPP_CPU_STRICT": "true"}, ["--cpu-strict", "1"]),
        ({"SM_LLAMA_CPP_SPLIT_MODE": "ROW"}, ["--split-mode", "row"]),
        ({"SM_LLAMA_CPP_ALIAS": "my model --api-key x"}, ["--alias", "my model --api-key x"]),
        (
            {"SM_LLAMA_CPP_CONTROL_VECTOR_LAYER_RANGE": "2 5"},
            ["--control-vector-layer-range", "2", "5"],
        ),
        (
            {"SM_LLAMA_CPP_CTX_SIZE": "4096", "SM_LLAMA_CPP_BATCH_SIZE": "512"},
            ["--batch-size", "512", "--ctx-size", "4096"],
        ),
        # Read by the proxy, never forwarded.
        (
            {
                "SM_LLAMA_CPP_MODEL": "m.gguf",
                "SM_LLAMA_CPP_MODEL_DIR": "/x",
                "SM_LLAMA_CPP_PORT": "9",
                "SM_LLAMA_CPP_API_KEY": "upstream-k3y",
                "SM_LLAMA_CPP_HOST": "0.0.0.0",
            },
            [],
        ),
        ({"SEMIF_THREADS": "2", "OTHER": "1", "SM_LLAMA_CPP_": "x"}, []),
    ],
)
def test_env_to_args_on_the_real_flags(
    real: FlagTable, env: dict[str, str], expected: list[str]
) -> None:
    assert env_to_args(env, real) == expected


FLASH_ATTN_MAYBE = (
    "SM_LLAMA_CPP_FLASH_ATTN: llama-server --flash-attn takes on|off|auto, got 'maybe'"
)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SM_LLAMA_CPP_FLASH_ATTN": "maybe"}, FLASH_ATTN_MAYBE),
        ({"SM_LLAMA_CPP_NOT_A_FLAG": "1"}, "SM_LLAMA_CPP_NOT_A_FLAG: this llama-server has no"),
        ({"SM_LLAMA_CPP_METRICS": "sometimes"}, "SM_LLAMA_CPP_METRICS: llama-server --metrics is"),
        ({"SM_LLAMA_CPP_SPLIT_MODE": "diagonal"}, "--split-mode takes none|layer|row|tensor"),
        ({"SM_LLAMA_CPP_CTX_SIZE": ""}, "SM_LLAMA_CPP_CTX_SIZE: llama-server --ctx-size needs a"),
        ({"SM_LLAMA_CPP_CONTROL_VECTOR_LAYER_RANGE": "2"}, "takes two values"),
        ({"SM_LLAMA_CPP_DRAFT_MAX": "4"}, "SM_LLAMA_CPP_DRAFT_MAX: llama-server --draft-max: the"),
        ({"SM_LLAMA_CPP_M": "/x.gguf"}, "SM_LLAMA_CPP_M: llama-server -m: the model is chosen by"),
        ({"SM_LLAMA_CPP_HF_REPO": "a/b"}, "SM_LLAMA_CPP_HF_REPO: llama-server --hf-repo: the"),
        ({"SM_LLAMA_CPP_API_PREFIX": "/x"}, "SM_LLAMA_CPP_API_PREFIX: llama-server --api-prefix:"),
        ({"SM_LLAMA_CPP_H": "1"}, "SM_LLAMA_CPP_H: llama-server -h: llama-server would print"),
        ({"SM_LLAMA_CPP_API_KEY_FILE": "/k"}, "SM_LLAMA_CPP_API_KEY_FILE: not supported"),
        (
            {"SM_LLAMA_CPP_C": "2048", "SM_LLAMA_CPP_CTX_SIZE": "4096"},
            "SM_LLAMA_CPP_CTX_SIZE: SM_LLAMA_CPP_C sets the same llama-server flag (--ctx-size)",
        ),
    ],
)
def test_env_to_args_refuses_what_llama_server_would_reject(
    real: FlagTable, env: dict[str, str], message: str
) -> None:
    with pytest.raises(LlamaArgsError) as info:
        env_to_args(env, real)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SM_LLAMA_CPP_FLASH_ATTN": "true"}, ["--flash-attn"]),
        ({"SM_LLAMA_CPP_FLASH_ATTN": "on"}, ["--flash-attn"]),
        ({"SM_LLAMA_CPP_FLASH_ATTN": "false"}, []),
        ({"SM_LLAMA_CPP_NO_MMAP": ""}, ["--no-mmap"]),
        ({"SM_LLAMA_CPP_NO_MMAP": "false"}, []),
        ({"SM_LLAMA_CPP_NO_KV_OFFLOAD": "1"}, ["--no-kv-offload"]),
        ({"SM_LLAMA_CPP_CONT_BATCHING": "off"}, ["--no-cont-batching"]),
        ({"SM_LLAMA_CPP_NGL": "99", "SM_LLAMA_CPP_C": "2048"}, ["-c", "2048", "-ngl", "99"]),
    ],
)
def test_env_to_args_on_an_older_help(env: dict[str, str], expected: list[str]) -> None:
    assert env_to_args(env, parse_help(OLD_HELP)) == expected


def test_older_help_refuses_values_the_old_flag_cannot_take() -> None:
    old = parse_help(OLD_HELP)
    with pytest.raises(LlamaArgsError, match=r"--flash-attn is an on/off switch .*'auto'"):
        env_to_args({"SM_LLAMA_CPP_FLASH_ATTN": "auto"}, old)
    with pytest.raises(LlamaArgsError, match=r"--split-mode takes none\|layer\|row, got 'tensor'"):
        env_to_args({"SM_LLAMA_CPP_SPLIT_MODE": "tensor"}, old)


def test_help_is_read_once_per_binary_version(tmp_path: Path) -> None:
    """Through load_settings, with another build's llama-server (its --help only): the mapping
    follows that build, and its help is read again only when the file changes."""
    calls = tmp_path / "calls"
    fake = tmp_path / "llama-server"
    fake.write_text(f"#!/bin/sh\necho x >> '{calls}'\ncat <<'EOF'\n{OLD_HELP}EOF\n")
    fake.chmod(0o755)
    model = _touch(tmp_path / "m.gguf")
    env = {"SEMIF_LLAMA_SERVER": str(fake), "SM_LLAMA_CPP_FLASH_ATTN": "true"}
    assert load_settings(env, model=str(model)).llama_server_args == ("--flash-attn",)
    assert load_settings(env, model=str(model)).llama_server_args == ("--flash-attn",)
    assert calls.read_text().count("x") == 1
    new_help = "-fa,   --flash-attn [on|off|auto]       set Flash Attention use\n"
    fake.write_text(f"#!/bin/sh\necho x >> '{calls}'\ncat <<'EOF'\n{new_help}EOF\n")
    os.utime(fake, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert load_settings(env, model=str(model)).llama_server_args == ("--flash-attn", "on")
    assert calls.read_text().count("x") == 2


# -- settings -----------------------------------------------------------------------------------


def test_settings_name_the_variable_llama_server_would_reject(tmp_path: Path) -> None:
    model = _touch(tmp_path / "m.gguf")
    with pytest.raises(SettingsError, match=r"^SM_LLAMA_CPP_FLASH_ATTN: .* got 'maybe'$"):
        load_settings({"SM_LLAMA_CPP_FLASH_ATTN": "maybe"}, model=str(model))


def test_decision_only_settings_need_no_binary(tmp_path: Path) -> None:
    model = _touch(tmp_path / "m.gguf")
    env = {"SEMIF_LLAMA_SERVER": str(tmp_path / "none"), "SM_LLAMA_CPP_FLASH_ATTN": "maybe"}
    assert load_settings({**env, "SEMIF_CHAT": "off"}, model=str(model)).llama_server_args == ()
    with pytest.raises(SettingsError, match=r"^SM_LLAMA_CPP_FLASH_ATTN: cannot check it against"):
        load_settings(env, model=str(model))


def test_parallel_needs_three_sequences(tmp_path: Path) -> None:
    model = _touch(tmp_path / "m.gguf")
    with pytest.raises(SettingsError, match=r"^SEMIF_PARALLEL: .*greater than or equal to 3"):
        load_settings({"SEMIF_PARALLEL": "2"}, model=str(model), chat=False)
    assert load_settings({"SEMIF_PARALLEL": "3"}, model=str(model), chat=False).n_parallel == 3


def test_upstream_api_key_is_the_proxy_key_and_never_forwarded(tmp_path: Path) -> None:
    model = _touch(tmp_path / "m.gguf")
    s = load_settings({"SM_LLAMA_CPP_API_KEY": "upstream-k3y"}, model=str(model))
    assert s.api_key == "upstream-k3y" and "--api-key" not in s.llama_server_args
    both = {"SM_LLAMA_CPP_API_KEY": "upstream-k3y", "SEMIF_API_KEY": "s3cr3t-xyz"}
    assert load_settings(both, model=str(model)).api_key == "s3cr3t-xyz"


# -- the real llama-server through the real proxy ----------------------------------------------


def _child_argv(server: ProxyProcess) -> list[str]:
    pid = server.call("GET", "/health").json()["llama_server"]["pid"]
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def _has(argv: list[str], *pair: str) -> bool:
    return any(argv[i : i + len(pair)] == list(pair) for i in range(len(argv)))


@pytest.mark.parametrize(
    ("value", "argument", "state"), [("true", "on", "enabled"), ("off", "off", "disabled")]
)
def test_flash_attn_and_short_flags_reach_llama_server(
    model_path: Path, tmp_path: Path, value: str, argument: str, state: str
) -> None:
    log = tmp_path / "proxy.log"
    server = ProxyProcess(
        model_path,
        {
            "SEMIF_DECISIONS": "off",
            "SM_LLAMA_CPP_FLASH_ATTN": value,
            "SM_LLAMA_CPP_C": "2048",
            "SM_LLAMA_CPP_T": "1",
            "SM_LLAMA_CPP_NGL": "0",
            "SM_LLAMA_CPP_PARALLEL": "1",  # one slot: /props shows the whole context
            # llama.cpp reports the flash attention it really uses at verbosity 4.
            "SM_LLAMA_CPP_LOG_VERBOSITY": "4",
        },
        log_path=log,
    )
    del server.env["SM_LLAMA_CPP_CTX_SIZE"]  # the helper's default; -c sets the same flag
    server.start()
    try:
        argv = _child_argv(server)
        assert _has(argv, "--flash-attn", argument), argv
        assert _has(argv, "-c", "2048") and _has(argv, "-t", "1") and _has(argv, "-ngl", "0")
        props = server.call("GET", "/props").json()
        assert props["default_generation_settings"]["n_ctx"] == 2048
        chat = server.call(
            "POST",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert chat.status == 200, chat.body
        reported = re.findall(r"flash_attn\s*=\s*(\w+)", log.read_text())
        assert reported and set(reported) == {state}
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("SM_LLAMA_CPP_NOT_A_FLAG", "1", "SM_LLAMA_CPP_NOT_A_FLAG: this llama-server has no flag"),
        ("SM_LLAMA_CPP_FLASH_ATTN", "maybe", FLASH_ATTN_MAYBE),
    ],
)
def test_serve_stops_at_once_naming_the_variable(
    model_path: Path, var: str, value: str, message: str
) -> None:
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "semif_proxy.cli", "serve", "--model", str(model_path)],
        env={**os.environ, var: value, "SM_LLAMA_CPP_PORT": str(free_port())},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert time.monotonic() - start < 30
