"""What the deploy commands write on stderr while they work, under moto: byte bars for
package-model on a terminal (nothing off one), and for build-image and batch the name of what
they started before the first status line, then each change of status with the time elapsed,
and on failure the build's log link or the job's FailureReason."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.sagemaker.models import sagemaker_backends
from tqdm import tqdm

from semif_proxy import progress
from semif_proxy.cli import main
from semif_proxy.deploy import package
from tests.test_deploy import BASE, REGION, ROLE, ROOT, aws, deployment  # noqa: F401 (aws: autouse)


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> boto3.session.Session:
    """boto3's default session: the commands' own clients come from it, with its handlers."""
    s = boto3.session.Session(region_name=REGION)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", s)
    return s


@pytest.mark.parametrize("uncompressed", [False, True])
def test_package_model_bars_on_a_terminal(
    tiny_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    uncompressed: bool,
) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="models")
    size = tiny_model.stat().st_size
    # Off a terminal (a pipe, a CI log): no bar at all.
    package.package_model(s3, tiny_model, "s3://models/a/", tmp_path, uncompressed)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "interactive", lambda stream=None: True)
    package.package_model(s3, tiny_model, "s3://models/b/", tmp_path, uncompressed)
    err = capsys.readouterr().err
    wanted = ["hashing tiny.gguf", "uploading tiny.gguf"]
    if not uncompressed:
        wanted = ["hashing tiny.gguf", "compressing tiny.gguf", "uploading model.tar.gz"]
    found = re.findall(r"(hashing|compressing|uploading) ([\w.]+): 100%", err)
    assert [f"{verb} {name}" for verb, name in dict.fromkeys(found)] == wanted
    # Bytes, scaled by 1024: the GGUF's whole size, done of total (e.g. 457k/457k).
    shown = tqdm.format_sizeof(size, divisor=1024)
    assert f"hashing tiny.gguf: 100%|██████████| {shown}/{shown}" in err, err


def build_args() -> list[str]:
    return [
        "build-image",
        "--repository",
        "semif-proxy",
        "--base-image",
        BASE,
        "--source",
        "s3://builds/src/",
        "--role",
        ROLE,
        "--root",
        str(ROOT),
    ]


def build_fixtures() -> None:
    boto3.client("s3", region_name=REGION).create_bucket(Bucket="builds")
    ecr = boto3.client("ecr", region_name=REGION)
    ecr.create_repository(repositoryName="semif-proxy")
    manifest = {"schemaVersion": 2, "config": {}, "layers": []}
    manifest["mediaType"] = "application/vnd.docker.distribution.manifest.v2+json"
    ecr.put_image(
        repositoryName="semif-proxy", imageManifest=json.dumps(manifest), imageTag="latest"
    )


def test_build_image_names_the_build_before_its_status(
    session: boto3.session.Session, capsys: pytest.CaptureFixture[str]
) -> None:
    build_fixtures()
    assert main(build_args()) == 0
    lines = capsys.readouterr().err.splitlines()
    started = re.fullmatch(
        r"image build (semif-proxy-image:[\w-]+): started in CodeBuild project "
        r"semif-proxy-image, pushing semif-proxy:latest",
        lines[0],
    )
    assert started, lines
    assert lines[1:] == [f"image build {started.group(1)}: SUCCEEDED (0m00s)"]


def test_failed_build_prints_its_log_link(
    session: boto3.session.Session, capsys: pytest.CaptureFixture[str]
) -> None:
    """moto's builds always succeed: its BatchGetBuilds answer is turned into a failed one."""

    def failed(parsed: dict[str, Any], **_: Any) -> None:
        build = parsed["builds"][0]
        build["buildStatus"], build["currentPhase"] = "FAILED", "COMPLETED"
        build["phases"] = [
            {"phaseType": "SUBMITTED", "phaseStatus": "SUCCEEDED"},
            {"phaseType": "BUILD", "phaseStatus": "FAILED"},
        ]

    session.events.register("after-call.codebuild.BatchGetBuilds", failed)
    build_fixtures()
    assert main(build_args()) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("image build semif-proxy-image:")
    build_id = lines[0].split()[2].rstrip(":")
    assert lines[1] == f"image build {build_id}: FAILED (0m00s)"
    # moto's deepLink, as the build reported it.
    link = "https://console.aws.amazon.com/cloudwatch/home?region=eu-west-2#logEvent:group=null;stream=null"
    assert lines[2] == (
        f"semif-proxy build-image: image build {build_id} ended FAILED in phase BUILD; "
        f"its log: {link}"
    )


BATCH = ["batch", "--input", "s3://data/in/", "--output", "s3://data/out/"]
BATCH += ["--model-name", "semif-batch", "--instance-type", "ml.c5.xlarge"]
BATCH += ["--image", deployment().image, "--model-data", "s3://m/model.tar.gz", "--role", ROLE]


def test_batch_names_its_job_before_waiting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(BATCH) == 0
    captured = capsys.readouterr()
    job = captured.out.split()[0]
    assert captured.err.splitlines() == [
        f"transform job {job}: started on model semif-batch (logs: CloudWatch "
        f"/aws/sagemaker/TransformJobs, streams {job}/...)",
        f"transform job {job}: Completed (0m00s)",
    ]
    # --no-wait: named all the same.
    assert main([*BATCH, "--no-wait"]) == 0
    captured = capsys.readouterr()
    job = captured.out.split()[0]
    assert captured.err.splitlines() == [
        f"transform job {job}: started on model semif-batch (logs: CloudWatch "
        f"/aws/sagemaker/TransformJobs, streams {job}/...)"
    ]


def test_failed_batch_job_prints_its_failure_reason(
    session: boto3.session.Session, capsys: pytest.CaptureFixture[str]
) -> None:
    """moto's jobs complete when created: the job moto stores is made to have failed."""
    reason = "ClientError: See job logs for more information"

    def fail(params: dict[str, Any], **_: Any) -> None:
        job = sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].transform_jobs[
            params["TransformJobName"]
        ]
        job.transform_job_status, job.failure_reason = "Failed", reason

    session.events.register("provide-client-params.sagemaker.DescribeTransformJob", fail)
    assert main(BATCH) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    job = re.fullmatch(r"transform job ([\w-]+): started on model semif-batch .*", lines[0])
    assert job, lines
    name = job.group(1)
    assert lines[1:] == [
        f"transform job {name}: Failed (0m00s)",
        f"semif-proxy batch: transform job '{name}' is Failed: {reason} (logs: CloudWatch "
        f"/aws/sagemaker/TransformJobs, streams {name}/...)",
    ]
