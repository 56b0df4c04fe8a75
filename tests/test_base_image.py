"""The child image against its base as the base really is, without Docker.

The AWS llama.cpp SageMaker image builds llama.cpp with GGML_BACKEND_DL=ON (the CPU backend is a
module loaded at run time, not linked) and keeps only build/bin/ in /opt/llama.cpp/bin, on PATH
and LD_LIBRARY_PATH, with no headers. scripts/base_sim.sh builds the pinned llama.cpp that way
into a cache; here the image's own builder step (container/build-extension.sh, run as the
Dockerfile's RUN line runs it) builds a fresh venv against it from the build context
.dockerignore lets through, and the runtime stage's selfcheck and ENTRYPOINT run in the base's
environment from `/`: no SEMIF_* settings, nothing of this checkout on any path.

Differences from the real base, all said in README "Verified here vs only on AWS": Python 3.11
here (the base has 3.12, not installable here), llama.cpp b11312 (the base: b10433), LLAMA_CURL
off (a deprecated no-op at b11312), no dnf, and the headers come from the pinned source tree
instead of GitHub's archive of the commit. The CPU backends are the base's: all 14 x86 variants,
ggml picking the best for this CPU (SEMIF_BASE_SIM_VARIANTS=one: a single loadable
libggml-cpu.so, loaded through ggml's fallback instead; ~7 minutes less to build).

Before the extension loaded ggml's backends itself, the model load here failed with llama.cpp's
"no backends are loaded": ggml searches only the executable's folder (/usr/bin for Python) and
the working directory (/).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from semif_proxy.testing.server import ProxyProcess
from tests.helpers.elf import exported_symbols
from tests.helpers.image import DOCKERFILES, IMAGE_VENV, ROOT, build_context, parse

CACHE = Path(os.environ.get("SEMIF_CACHE_DIR", Path.home() / ".cache" / "semif-proxy"))
LLAMA = CACHE / "llama.cpp-b11312"
# What pip needs to reach its index from here (certificates, proxies, its own settings).
NETWORK_SETTINGS = ("PIP_", "SSL_", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
# The DLC's PATH without its own folder (Amazon Linux's default).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROUTING = {
    "id": "route-1",
    "state": "Customer email: I requested a password reset three times but the email never "
    "arrives. I cannot log in.",
    "question": "Which support queue should handle this ticket?",
    "options": [
        {"id": "billing", "description": "Billing, invoices, refunds and payment problems"},
        {
            "id": "account_access",
            "description": "Login, password reset and account access problems",
        },
        {"id": "shipping", "description": "Delivery, tracking and shipping problems"},
    ],
}
# A cold run builds llama.cpp the base's way first (~15 minutes on 2 idle cores, once).
pytestmark = [
    # Builds and starts the simulated base image: heavy on both cores (the serial part).
    pytest.mark.serial,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(
        not (LLAMA / "src" / "include" / "llama.h").is_file(),
        reason="needs the pinned llama.cpp tree (make build)",
    ),
]


def base_env(bin_dir: Path) -> dict[str, str]:
    """The DLC's environment: its ENV lines, PATH and LD_LIBRARY_PATH on /opt/llama.cpp/bin (the
    latter with the trailing ':' its `${LD_LIBRARY_PATH}` leaves)."""
    return {
        "PATH": f"{bin_dir}:{SYSTEM_PATH}",
        "LD_LIBRARY_PATH": f"{bin_dir}:",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONIOENCODING": "UTF-8",
    }


def mapped(pid: int, prefix: str) -> set[Path]:
    """Resolved paths of the shared objects whose file name starts with prefix in process pid."""
    found = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and Path(parts[5]).name.startswith(prefix):
            found.add(Path(parts[5]).resolve())
    return found


@pytest.fixture(scope="module")
def base_bin() -> Path:
    """<sim>/opt/llama.cpp/bin, built by the same script `make base-sim` runs (cached)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "base_sim.sh")],
        capture_output=True,
        text=True,
        timeout=3500,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    bin_dir = Path(out.stdout.strip()) / "opt" / "llama.cpp" / "bin"
    # Laid out like the base: the loadable CPU backend(s) and no headers.
    assert list(bin_dir.glob("libggml-cpu*.so")) and not list(bin_dir.rglob("*.h"))
    return bin_dir.resolve()


@pytest.fixture(scope="module")
def image_venv(base_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The builder stage: its RUN line, in the base's environment, on the build context."""
    tmp = tmp_path_factory.mktemp("image")
    context = build_context(tmp / "src")
    assert not (context / "tests").exists() and not (context / ".venv").exists()
    venv = tmp / "semif"
    builder = parse(DOCKERFILES["cpu"]).stages[0]
    [run] = [r for r in builder.values("RUN") if "build-extension.sh" in r]
    env = {
        # The network settings pip needs here; nothing of SEMIF_* or of this checkout's venv.
        **{k: v for k, v in os.environ.items() if k.startswith(NETWORK_SETTINGS) or "CA_" in k},
        **base_env(base_bin),
        # Debian 12 has no python3.12: the interpreter of this test run stands in for the base's.
        "PYTHON": str(Path(sys.executable).resolve()),
        # The headers "fetched separately": the pinned tree, for GitHub's archive of the commit.
        "LLAMA_HEADERS_TREE": str(LLAMA / "src"),
        # A build ARG as CodeBuild would pass it; the image then fails on any other llama.cpp.
        "LLAMA_CPP_REF": "0c1e570",
    }
    command = run.replace(" /src ", f" {context} ").replace(IMAGE_VENV, str(venv))
    out = subprocess.run(
        ["/bin/bash", "-o", "pipefail", "-c", command],
        cwd=context,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "build 11312, commit 0c1e570" in out.stderr  # read from the base's llama-server
    return venv


@pytest.fixture(scope="module")
def runtime_env(base_bin: Path, image_venv: Path) -> dict[str, str]:
    return parse(DOCKERFILES["cpu"]).env(base_env(base_bin), image_venv)


def test_the_venv_links_the_bases_libllama_and_bundles_nothing(
    image_venv: Path, base_bin: Path
) -> None:
    [package] = image_venv.glob("lib/python3*/site-packages/semif_proxy")
    [engine] = package.glob("_engine.*.so")
    assert not list(package.glob("llama/*"))  # no libllama or llama-server of our own
    needed = subprocess.run(
        ["readelf", "-d", str(engine)], capture_output=True, text=True, timeout=30
    ).stdout
    assert "[libllama.so" in needed and "[libggml.so" in needed
    # Built by another compiler than the base's libllama: nothing of ours may interpose on it
    # (on a GPU host an exported C++ runtime symbol crashed its tokenizer; csrc/exports.map).
    assert exported_symbols(engine) == {"PyInit__engine"}
    # The base keeps versioned sonames (libllama.so.0) and the loader finds them on its path.
    ldd = subprocess.run(
        ["ldd", str(engine)],
        env=base_env(base_bin),
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    for lib in ("libllama.so", "libggml.so", "libggml-base.so"):
        [line] = [li for li in ldd.splitlines() if li.strip().startswith(lib)]
        assert str(base_bin) in line, ldd


def test_selfcheck_passes_in_the_base_environment(
    runtime_env: dict[str, str], base_bin: Path
) -> None:
    """The runtime stage's own RUN line: loads a tiny model, so no CPU backend means failure."""
    [run] = [r for r in parse(DOCKERFILES["cpu"]).runtime.values("RUN") if "selfcheck" in r]
    out = subprocess.run(
        ["/bin/bash", "-o", "pipefail", "-c", run],
        cwd="/",
        env=runtime_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads(out.stdout)
    assert [Path(p).resolve().parent for p in report["libllama"]] == [base_bin]
    assert Path(report["backend_dir"]).resolve() == base_bin  # loaded by the extension itself
    assert any(d.startswith("cpu:") for d in report["devices"])
    assert report["forward_pass"] == "ok"
    assert Path(report["llama_server"]).resolve() == base_bin / "llama-server"
    assert report["llama_server_build"] == report["llama_cpp_build"] == 11312
    assert report["llama_cpp_commit"] == "0c1e570"


@pytest.fixture(scope="module")
def image(
    runtime_env: dict[str, str], model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    """`docker run <image> serve` as SageMaker does it: the ENTRYPOINT plus `serve`, from `/`,
    the model unpacked read-only in SM_LLAMA_CPP_MODEL_DIR, the port in SAGEMAKER_BIND_TO_PORT."""
    tmp = tmp_path_factory.mktemp("opt-ml")
    model_dir = tmp / "model"
    model_dir.mkdir()
    (model_dir / model_path.name).symlink_to(model_path)
    model_dir.chmod(0o555)
    server = ProxyProcess(None, log_path=tmp / "image.log")
    server.env = {
        **runtime_env,
        "SM_LLAMA_CPP_MODEL_DIR": str(model_dir),
        "SAGEMAKER_BIND_TO_PORT": str(server.port),
        "LLAMA_CPP_UPSTREAM_PORT": str(server.upstream_port),
    }
    entrypoint = parse(DOCKERFILES["cpu"]).entrypoint()
    server.command = ["env", "-C", "/", *entrypoint, "serve"]
    try:
        server.start(timeout=300)
    except RuntimeError:
        raise AssertionError(server.log_path.read_text()[-6000:]) from None
    yield server
    try:
        assert server.stop() == 0
    finally:
        model_dir.chmod(0o755)


def test_the_image_serves_decisions_on_the_bases_backends(
    image: ProxyProcess, base_bin: Path
) -> None:
    reply = image.call("POST", "/v1/decisions", {"decision": ROUTING}, timeout=120)
    assert reply.status == 200, reply.body
    result = reply.json()["result"]
    assert result["option_ids"] == ["billing", "account_access", "shipping"]
    assert math.isclose(sum(result["probabilities"]), 1.0, abs_tol=1e-6)
    assert result["model"]["llama_cpp_build"] == 11312
    # SEMIF_REPACK=auto timed both layouts on the base's backends (on an AMX Xeon the base's
    # repacked kernels die of SIGILL: that trial failed, and its layout was not chosen).
    repack = result["model"]["repack"]
    assert repack["setting"] == "auto" and set(repack["measured"]) == {"on", "off"}
    assert repack["measured"]["on" if repack["on"] else "off"]["failed"] is None, repack
    # The serving process computes with the base's own libllama and loadable CPU backend.
    assert image.proc is not None
    for prefix in ("libllama.so", "libggml-cpu"):
        found = mapped(image.proc.pid, prefix)
        assert found and {p.parent for p in found} == {base_bin}, (prefix, found)


def test_the_image_chats_through_the_bases_llama_server(
    image: ProxyProcess, base_bin: Path
) -> None:
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
    reply = image.call("POST", "/v1/chat/completions", body, timeout=120)
    assert reply.status == 200, reply.body
    answer = reply.json()
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert 1 <= answer["usage"]["completion_tokens"] <= 4
    pid = image.call("GET", "/health", timeout=30).json()["llama_server"]["pid"]
    assert Path(f"/proc/{pid}/exe").resolve() == base_bin / "llama-server"
