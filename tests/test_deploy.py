"""SageMaker deploy tooling against moto (S3, ECR, CodeBuild, SageMaker, SageMaker runtime):
the API calls made, their parameters, and every error path. No real AWS call."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from semif_proxy.cli import main
from semif_proxy.deploy import endpoint, image, package
from semif_proxy.deploy.deployment import Deployment
from semif_proxy.deploy.errors import DeployError
from semif_proxy.model.files import MANIFEST_NAME, file_sha256, model_sha256

REGION = "us-east-1"
ROOT = Path(__file__).resolve().parent.parent
ROLE = "arn:aws:iam::123456789012:role/semif"
BASE = "public.ecr.aws/deep-learning-containers/llama-cpp@sha256:" + "a" * 64


@pytest.fixture(autouse=True)
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield


class Calls:
    """Every API call a client makes, with the exact parameters it sent."""

    def __init__(self, *clients: Any) -> None:
        self.made: list[tuple[str, dict[str, Any]]] = []
        for c in clients:
            c.meta.events.register("provide-client-params.*.*", self._record)

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.made.append((model.name, dict(params)))

    def names(self) -> list[str]:
        return [n for n, _ in self.made]

    def params(self, name: str) -> dict[str, Any]:
        return next(p for n, p in self.made if n == name)


def test_package_model_uploads_gguf_and_manifest(tiny_model: Path, tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="models")
    uri = package.package_model(s3, tiny_model, "s3://models/semif/", tmp_path)
    assert uri == "s3://models/semif/model.tar.gz"
    blob = s3.get_object(Bucket="models", Key="semif/model.tar.gz")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        assert sorted(tar.getnames()) == sorted([tiny_model.name, MANIFEST_NAME])
        manifest = json.load(tar.extractfile(MANIFEST_NAME))  # type: ignore[arg-type]
        tar.extractall(tmp_path / "opt-ml-model", filter="data")
    [entry] = manifest["files"]
    assert entry["file"] == tiny_model.name and entry["bytes"] == tiny_model.stat().st_size
    assert entry["sha256"] == file_sha256(tiny_model)
    # The server reads the manifest instead of hashing again (and writes no sidecar).
    unpacked = tmp_path / "opt-ml-model" / tiny_model.name
    assert model_sha256(unpacked) == entry["sha256"]
    assert not unpacked.with_name(unpacked.name + ".sha256.json").exists()


def test_package_model_writes_readable_modes(tiny_model: Path, tmp_path: Path) -> None:
    """0644 files owned by root whatever the source's mode and the umask: SageMaker unpacks as
    root; any user can then read the GGUF."""
    private = tmp_path / "src" / "private.gguf"
    private.parent.mkdir()
    private.write_bytes(tiny_model.read_bytes())
    private.chmod(0o600)
    previous = os.umask(0o077)
    try:
        archive, _ = package.build_archive(private, tmp_path)
    finally:
        os.umask(previous)
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    assert sorted(m.name for m in members) == sorted([private.name, MANIFEST_NAME])
    for m in members:
        assert (m.mode, m.uid, m.gid, m.uname, m.gname) == (0o644, 0, 0, "root", "root"), m.name
    folder = tarfile.TarInfo("dir")
    folder.type = tarfile.DIRTYPE
    folder.mode = 0o700
    assert package.normalize(folder).mode == 0o755


def test_package_model_errors(tiny_model: Path, tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    with pytest.raises(DeployError, match="could not use bucket 'missing'"):
        package.package_model(s3, tiny_model, "s3://missing/x/", tmp_path)
    with pytest.raises(DeployError, match="not an S3 URI"):
        package.package_model(s3, tiny_model, "/local/path", tmp_path)
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    with pytest.raises(DeployError, match="not a GGUF"):
        package.package_model(s3, text, "s3://b/", tmp_path)


def test_package_model_command(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    boto3.client("s3", region_name=REGION).create_bucket(Bucket="cli-models")
    assert main(["package-model", "--gguf", str(tiny_model), "--s3", "s3://cli-models/p"]) == 0
    assert capsys.readouterr().out.strip() == "s3://cli-models/p/model.tar.gz"
    assert main(["package-model", "--gguf", str(tiny_model), "--s3", "s3://nope/p"]) == 1
    assert "could not use bucket 'nope'" in capsys.readouterr().err


def image_build(**changes: Any) -> image.ImageBuild:
    base = {
        "project": "semif-image",
        "source": "s3://builds/src/",
        "repository": "semif-proxy",
        "tag": "v1",
        "base_image": BASE,
        "role_arn": ROLE,
    }
    return image.ImageBuild(**{**base, **changes})


def test_build_image_end_to_end(tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    codebuild = boto3.client("codebuild", region_name=REGION)
    ecr = boto3.client("ecr", region_name=REGION)
    s3.create_bucket(Bucket="builds")
    repo = ecr.create_repository(repositoryName="semif-proxy")["repository"]
    # What the buildspec's docker push leaves behind.
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {},
            "layers": [],
        }
    )
    pushed = ecr.put_image(repositoryName="semif-proxy", imageManifest=manifest, imageTag="v1")
    digest = pushed["image"]["imageId"]["imageDigest"]
    calls = Calls(s3, codebuild, ecr)

    uri = image.build_image(
        s3,
        codebuild,
        ecr,
        image_build(),
        ROOT,
        tmp_path,
        wait=lambda cb, bid: image.wait_build(cb, bid, interval=0, sleep=lambda _: None),
    )
    assert uri == f"{repo['repositoryUri']}@{digest}"
    assert calls.names() == [
        "DescribeRepositories",
        "HeadBucket",
        "PutObject",
        "BatchGetProjects",
        "CreateProject",
        "StartBuild",
        "BatchGetBuilds",
        "DescribeRepositories",
        "DescribeImages",
    ]
    project = calls.params("CreateProject")
    assert project["environment"]["privilegedMode"] is True
    assert project["source"] == {
        "type": "S3",
        "location": "builds/src/semif-proxy-source.zip",
        "buildspec": "container/buildspec.yml",
    }
    env = {v["name"]: v["value"] for v in project["environment"]["environmentVariables"]}
    assert env == {
        "ECR_REPOSITORY": "semif-proxy",
        "IMAGE_TAG": "v1",
        "DOCKERFILE": "container/Dockerfile",
        "VARIANT": "cpu",
        "BASE_IMAGE": BASE,
    }  # no LLAMA_CPP_REF: the Dockerfile reads the base image's own
    source = s3.get_object(Bucket="builds", Key="src/semif-proxy-source.zip")["Body"].read()
    import zipfile

    names = zipfile.ZipFile(io.BytesIO(source)).namelist()
    assert "container/buildspec.yml" in names and "csrc/engine.cpp" in names
    assert not any(n.startswith(("tests/", ".venv/", "semif_proxy/llama/")) for n in names)


def test_llama_cpp_ref_is_only_sent_when_given(monkeypatch: pytest.MonkeyPatch) -> None:
    def env(build: image.ImageBuild) -> dict[str, str]:
        spec = image.project_spec(build)
        return {v["name"]: v["value"] for v in spec["environment"]["environmentVariables"]}

    assert "LLAMA_CPP_REF" not in env(image_build())
    assert env(image_build(llama_cpp_ref="b9999"))["LLAMA_CPP_REF"] == "b9999"
    # An empty ref is refused before any AWS call.
    ecr = boto3.client("ecr", region_name=REGION)
    calls = Calls(ecr)
    with pytest.raises(DeployError, match="--llama-cpp-ref is empty"):
        image.build_image(ecr, ecr, ecr, image_build(llama_cpp_ref=" "), ROOT, Path("/none"))
    assert calls.made == []
    # The command passes no ref unless --llama-cpp-ref is given.
    seen: list[image.ImageBuild] = []
    monkeypatch.setattr(image, "build_image", lambda *a, **_: seen.append(a[3]) or "uri")
    common = ["build-image", "--repository", "r", "--base-image", BASE, "--source", "s3://b/"]
    assert main([*common, "--role", ROLE]) == 0
    assert main([*common, "--role", ROLE, "--llama-cpp-ref", "b9999"]) == 0
    assert [b.llama_cpp_ref for b in seen] == [None, "b9999"]
    # --gpu builds the same Dockerfile with VARIANT=gpu (the buildspec passes it on).
    assert main([*common, "--role", ROLE, "--gpu"]) == 0
    assert seen[-1].variant == "gpu" and env(seen[-1])["VARIANT"] == "gpu"


def test_build_image_updates_an_existing_project() -> None:
    codebuild = boto3.client("codebuild", region_name=REGION)
    spec = image.project_spec(image_build())
    with Stubber(codebuild) as stub:  # moto has no UpdateProject
        stub.add_response(
            "batch_get_projects",
            {"projects": [{"name": "semif-image"}]},
            {"names": ["semif-image"]},
        )
        stub.add_response("update_project", {"project": {"name": "semif-image"}}, spec)
        assert image.ensure_project(codebuild, image_build()) == "updated"


def test_build_image_errors(tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    codebuild = boto3.client("codebuild", region_name=REGION)
    ecr = boto3.client("ecr", region_name=REGION)
    with pytest.raises(DeployError, match="base image must be pinned by digest"):
        image.build_image(s3, codebuild, ecr, image_build(base_image="x:latest"), ROOT, tmp_path)
    with pytest.raises(DeployError, match=r"ECR repository 'semif-proxy'.*RepositoryNotFound"):
        image.build_image(s3, codebuild, ecr, image_build(), ROOT, tmp_path)
    ecr.create_repository(repositoryName="semif-proxy")
    with pytest.raises(DeployError, match="could not use bucket 'builds'"):
        image.build_image(s3, codebuild, ecr, image_build(), ROOT, tmp_path)
    failed = {
        "builds": [
            {
                "id": "b:1",
                "buildStatus": "FAILED",
                "phases": [
                    {"phaseType": "SUBMITTED", "phaseStatus": "SUCCEEDED"},
                    {"phaseType": "BUILD", "phaseStatus": "FAILED"},
                ],
            }
        ]
    }
    with Stubber(codebuild) as stub:
        stub.add_response("batch_get_builds", failed, {"ids": ["b:1"]})
        with pytest.raises(DeployError, match="ended FAILED in phase BUILD"):
            image.wait_build(codebuild, "b:1", sleep=lambda _: None)


NOW = datetime(2026, 3, 1, 12, 30, 45, 123456, tzinfo=timezone.utc)
STAMPED = "semif-ep-20260301-123045-123"  # the model and config a deploy at NOW makes


def deployment(**changes: Any) -> Deployment:
    base = {
        "name": "semif-ep",
        "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/semif-proxy@sha256:" + "b" * 64,
        "model_data": "s3://models/semif/model.tar.gz",
        "role_arn": ROLE,
        "gpu_layers": 999,
        "env": {"SEMIF_MAX_DECISIONS": "16"},
        # moto's instance-type list predates c6i (the CLI default); c5 passes its validation.
        "instance_type": "ml.c5.xlarge",
    }
    return Deployment(**{**base, **changes})


def test_deploy_invoke_delete() -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    runtime = boto3.client("sagemaker-runtime", region_name=REGION)
    calls = Calls(sm)
    desc = endpoint.deploy(sm, deployment(), now=NOW)
    assert desc["EndpointStatus"] == "InService"
    assert calls.names()[:4] == [
        "DescribeEndpoint",  # none yet: create it
        "CreateModel",
        "CreateEndpointConfig",
        "CreateEndpoint",
    ]
    # Model and config carry a stamp, so that the next deploy can make new ones.
    assert desc["ModelName"] == desc["EndpointConfigName"] == STAMPED
    assert calls.params("CreateEndpoint") == {
        "EndpointName": "semif-ep",
        "EndpointConfigName": STAMPED,
    }
    model = calls.params("CreateModel")
    assert model["ModelName"] == STAMPED
    assert model["PrimaryContainer"]["ModelDataUrl"] == "s3://models/semif/model.tar.gz"
    assert "ModelDataSource" not in model["PrimaryContainer"]
    assert model["EnableNetworkIsolation"] is True
    assert model["PrimaryContainer"]["Environment"] == {
        "SM_LLAMA_CPP_MODEL_DIR": "/opt/ml/model",
        "SEMIF_MAX_DECISIONS": "16",
        "SM_LLAMA_CPP_N_GPU_LAYERS": "999",
    }
    [variant] = calls.params("CreateEndpointConfig")["ProductionVariants"]
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] >= 600
    assert variant["ModelDataDownloadTimeoutInSeconds"] >= 600
    assert variant["InstanceType"] == "ml.c5.xlarge"
    assert variant["ModelName"] == STAMPED
    _, body = endpoint.invoke(runtime, "semif-ep", b'{"decision": {}}')
    assert body  # moto answers with canned data; the call shape is what is tested here
    assert endpoint.delete(sm, "semif-ep") == [
        "endpoint semif-ep",
        f"endpoint config {STAMPED}",
        f"model {STAMPED}",
    ]
    assert sm.list_models()["Models"] == []
    assert sm.list_endpoint_configs()["EndpointConfigs"] == []
    with pytest.raises(DeployError, match="nothing named 'semif-ep'"):
        endpoint.delete(sm, "semif-ep")


def test_deploy_refuses_bad_input_before_any_call() -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    calls = Calls(sm)
    with pytest.raises(DeployError, match="image must be pinned by digest"):
        endpoint.deploy(sm, deployment(image="repo/semif-proxy:latest"))
    with pytest.raises(DeployError, match=r"model\.tar\.gz"):
        endpoint.deploy(sm, deployment(model_data="s3://models/model.gguf"))
    with pytest.raises(DeployError, match="at least 600"):
        endpoint.deploy(sm, deployment(startup_timeout=60))
    assert calls.made == []


def test_endpoint_failure_is_reported_with_its_reason() -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    failed = {
        "EndpointName": "semif-ep",
        "EndpointArn": "arn:aws:sagemaker:us-east-1:1:endpoint/semif-ep",
        "EndpointConfigName": "semif-ep",
        "EndpointStatus": "Failed",
        "FailureReason": "The primary container did not pass the ping health check.",
        "CreationTime": "2026-01-01T00:00:00Z",
        "LastModifiedTime": "2026-01-01T00:00:00Z",
    }
    creating = dict(failed, EndpointStatus="Creating")
    del creating["FailureReason"]
    with Stubber(sm) as stub:
        stub.add_response("describe_endpoint", creating, {"EndpointName": "semif-ep"})
        stub.add_response("describe_endpoint", failed, {"EndpointName": "semif-ep"})
        with pytest.raises(DeployError, match="is Failed: The primary container did not pass"):
            endpoint.wait_in_service(sm, "semif-ep", sleep=lambda _: None)


def test_deploy_command_needs_a_role(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SEMIF_SAGEMAKER_ROLE", raising=False)
    args = ["deploy", "--image", deployment().image, "--model-data", "s3://m/model.tar.gz"]
    assert main(args) == 2  # a usage error: refused before any AWS call
    assert "--role or set SEMIF_SAGEMAKER_ROLE" in capsys.readouterr().err
    assert main([*args, "--role", ROLE, "--env", "BROKEN"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert Deployment("n", "i", "m", ROLE).instance_type == "ml.c6i.xlarge"
    args += ["--instance-type", "ml.c5.xlarge"]
    assert main([*args, "--role", ROLE, "--gpu-layers", "10"]) == 0
    first, names = capsys.readouterr().out.splitlines()
    assert first == "semif-proxy InService"
    assert re.fullmatch(r"endpoint config (semif-proxy-\d{8}-\d{6}-\d{3}), model \1", names), names
