"""`semif-proxy build-image`: source to S3, a privileged CodeBuild project running
container/buildspec.yml, then the pushed image's digest from ECR."""

from __future__ import annotations

import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semif_proxy import progress
from semif_proxy.deploy import s3uri
from semif_proxy.deploy.errors import DeployError, aws_errors, poll

# What the image build needs; everything else in the repository stays home.
SOURCE_PATHS = (
    "pyproject.toml",
    "CMakeLists.txt",
    "README.md",
    ".dockerignore",
    "cmake",
    "csrc",
    "semif_proxy",
    "container",
)
FINISHED = {"SUCCEEDED", "FAILED", "FAULT", "STOPPED", "TIMED_OUT"}


@dataclass(frozen=True)
class ImageBuild:
    project: str
    source: str  # s3://bucket/key.zip
    repository: str
    tag: str
    base_image: str
    role_arn: str
    llama_cpp_ref: str | None = None  # None: the Dockerfile reads the base image's own
    compute_type: str = "BUILD_GENERAL1_LARGE"
    variant: str = "cpu"  # container/Dockerfile's VARIANT build argument: cpu or gpu


def require_digest(uri: str, what: str) -> None:
    if "@sha256:" not in uri:
        raise DeployError(f"{what} must be pinned by digest (...@sha256:<digest>), got {uri!r}")


def zip_source(root: Path, out: Path) -> Path:
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in SOURCE_PATHS:
            path = root / name
            if not path.exists():
                raise DeployError(f"source is missing {name} (run from the repository root)")
            files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
            for f in files:
                rel = f.relative_to(root)
                bundled = rel.parts[:2] == ("semif_proxy", "llama")  # local build output
                if "__pycache__" in rel.parts or f.suffix == ".so" or bundled:
                    continue
                zf.write(f, rel.as_posix())
    return out


def source_object(destination: str) -> tuple[str, str]:
    """Where the source zip goes: the URI itself if it names a .zip, else a fixed name under it."""
    bucket, key = s3uri.parse(destination)
    if not key.endswith(".zip"):
        key = s3uri.join(key, "semif-proxy-source.zip")
    return bucket, key


def project_spec(build: ImageBuild) -> dict[str, Any]:
    bucket, key = source_object(build.source)
    env = {
        "ECR_REPOSITORY": build.repository,
        "IMAGE_TAG": build.tag,
        "DOCKERFILE": "container/Dockerfile",
        "VARIANT": build.variant,
        "BASE_IMAGE": build.base_image,
    }
    if build.llama_cpp_ref is not None:
        env["LLAMA_CPP_REF"] = build.llama_cpp_ref
    return {
        "name": build.project,
        "source": {
            "type": "S3",
            "location": f"{bucket}/{key}",
            "buildspec": "container/buildspec.yml",
        },
        "artifacts": {"type": "NO_ARTIFACTS"},
        "environment": {
            "type": "LINUX_CONTAINER",
            "image": "aws/codebuild/amazonlinux-x86_64-standard:5.0",
            "computeType": build.compute_type,
            "privilegedMode": True,  # docker build inside the build container
            "environmentVariables": [
                {"name": k, "value": v, "type": "PLAINTEXT"} for k, v in env.items()
            ],
        },
        "serviceRole": build.role_arn,
        "timeoutInMinutes": 60,
    }


def upload_source(s3: Any, root: Path, destination: str, work_dir: Path) -> str:
    bucket, key = source_object(destination)
    archive = zip_source(root, work_dir / "source.zip")
    with aws_errors(f"use bucket {bucket!r}"):
        s3.head_bucket(Bucket=bucket)
    with aws_errors(f"upload the source to s3://{bucket}/{key}"):
        s3.upload_file(str(archive), bucket, key)
    return f"s3://{bucket}/{key}"


def ensure_project(codebuild: Any, build: ImageBuild) -> str:
    spec = project_spec(build)
    with aws_errors(f"look up CodeBuild project {build.project!r}"):
        found = codebuild.batch_get_projects(names=[build.project]).get("projects", [])
    if found:
        with aws_errors(f"update CodeBuild project {build.project!r}"):
            codebuild.update_project(**spec)
        return "updated"
    with aws_errors(f"create CodeBuild project {build.project!r}"):
        codebuild.create_project(**spec)
    return "created"


def wait_build(
    codebuild: Any,
    build_id: str,
    timeout: float = 3600,
    interval: float = 15,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    status_line = progress.Status(f"image build {build_id}")

    def step() -> tuple[bool, Any]:
        with aws_errors(f"read build {build_id}"):
            builds = codebuild.batch_get_builds(ids=[build_id]).get("builds", [])
        if not builds:
            raise DeployError(f"CodeBuild does not know build {build_id}")
        status = builds[0].get("buildStatus", "IN_PROGRESS")
        # In progress, the phase says more (QUEUED, PROVISIONING, BUILD, POST_BUILD, ...).
        phase = builds[0].get("currentPhase")
        status_line.update(f"{status} {phase}" if status == "IN_PROGRESS" and phase else status)
        if status in FINISHED and status != "SUCCEEDED":
            phases = builds[0].get("phases", [])
            failed = next(
                (p for p in phases if p.get("phaseStatus") not in (None, "SUCCEEDED")), {}
            )
            link = builds[0].get("logs", {}).get("deepLink")
            raise DeployError(
                f"image build {build_id} ended {status} in phase "
                f"{failed.get('phaseType', '?')}; its log: "
                f"{link or 'CloudWatch /aws/codebuild/' + build_id.split(':')[0]}"
            )
        return status == "SUCCEEDED", builds[0] if status == "SUCCEEDED" else status

    return poll(step, f"image build {build_id}", timeout, interval, sleep)


def image_uri(ecr: Any, repository: str, tag: str) -> str:
    with aws_errors(f"find {repository}:{tag} in ECR"):
        repo = ecr.describe_repositories(repositoryNames=[repository])["repositories"][0]
        details = ecr.describe_images(repositoryName=repository, imageIds=[{"imageTag": tag}])
    digest = details["imageDetails"][0]["imageDigest"]
    return f"{repo['repositoryUri']}@{digest}"


def build_image(
    s3: Any,
    codebuild: Any,
    ecr: Any,
    build: ImageBuild,
    root: Path,
    work_dir: Path,
    wait: Callable[[Any, str], dict[str, Any]] = wait_build,
) -> str:
    require_digest(build.base_image, "the base image")
    if build.llama_cpp_ref is not None and not build.llama_cpp_ref.strip():
        raise DeployError("--llama-cpp-ref is empty: give a ref (b1234) or leave the flag out")
    with aws_errors(f"use ECR repository {build.repository!r}"):
        ecr.describe_repositories(repositoryNames=[build.repository])
    upload_source(s3, root, build.source, work_dir)
    ensure_project(codebuild, build)
    with aws_errors(f"start a build of {build.project!r}"):
        started = codebuild.start_build(projectName=build.project)["build"]["id"]
    progress.note(
        f"image build {started}: started in CodeBuild project {build.project}, pushing "
        f"{build.repository}:{build.tag}"
    )
    wait(codebuild, started)
    return image_uri(ecr, build.repository, build.tag)
