"""The llama.cpp build a `llama-server --version` names: the container's builder stage reads it
from the base image and fails the build when it cannot. Checked on the real output of our
pinned build and on the formats llama.cpp printed before."""

from __future__ import annotations

import subprocess
import sys

import pytest

from semif_proxy.engine import native
from semif_proxy.llama_server.version import parse_version


def test_the_real_output_of_the_pinned_build() -> None:
    binary = native.llama_server_path()
    assert binary is not None
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    info = native.build_info()
    assert parse_version(text) == (info["llama_cpp_build"], info["llama_cpp_commit"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # b11xxx: common/build-info.cpp's llama_print_build_info
        (
            "version: 0.0.11312 (build 11312, commit 0c1e570)\n"
            "built with GNU 12.2.0 for Linux x86_64\n",
            (11312, "0c1e570"),
        ),
        # 2024-2025 builds (the AWS base b10433 falls in or after this range)
        (
            "load_backend: loaded CPU backend from /opt/llama.cpp/bin/libggml-cpu-icelake.so\n"
            "version: 10433 (9b05354ec)\nbuilt with cc (GCC) 11.5.0 for x86_64-amazon-linux\n",
            (10433, "9b05354ec"),
        ),
        # older log-style lines
        ("main: build = 1234 (abcdef12)\n", (1234, "abcdef12")),
        ("build: 3456 (0a1b2c3d) with cc (GCC) 12 for x86_64-linux-gnu\n", (3456, "0a1b2c3d")),
        # a build made without git metadata
        ("version: 11312 (unknown)\n", (11312, "unknown")),
    ],
)
def test_formats_llama_cpp_has_printed(text: str, expected: tuple[int, str]) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize("text", ["", "llama-server: command not found\n", "version: dev\n"])
def test_unparseable_output_is_an_error_not_a_skip(text: str) -> None:
    with pytest.raises(ValueError, match="unrecognised llama-server --version output"):
        parse_version(text)


def test_the_command_the_builder_stage_runs() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "semif_proxy.llama_server.version"],
        input="version: 10433 (9b05354ec)\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (ok.returncode, ok.stdout) == (0, "10433 9b05354ec\n")
    bad = subprocess.run(
        [sys.executable, "-m", "semif_proxy.llama_server.version"],
        input="nothing useful\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 1 and "unrecognised" in bad.stderr
