"""GPU deploys: the CUDA 13 image needs NVIDIA driver >= 580, so a GPU variant gets the
InferenceAmiVersion with that driver; CPU/GPU mismatches, and arm64 (Graviton) types for the
amd64-only image, are refused before any AWS call."""

from __future__ import annotations

import boto3
import botocore.session
import pytest

from semif_proxy.cli import main
from semif_proxy.deploy import endpoint, instances
from semif_proxy.deploy.errors import DeployError, UsageError
from tests.test_deploy import (  # noqa: F401 (aws: autouse)
    NOW,
    REGION,
    ROLE,
    STAMPED,
    Calls,
    aws,
    deployment,
)

CUDA13_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"


def test_default_ami_is_botocores_driver_580_one() -> None:
    model = botocore.session.get_session().get_service_model("sagemaker")
    shape = model.shape_for("ProductionVariant").members["InferenceAmiVersion"]
    assert instances.DEFAULT_GPU_AMI == CUDA13_AMI
    assert CUDA13_AMI in shape.enum
    assert "NVIDIA driver version: 580" in shape.documentation.split(CUDA13_AMI)[1][:200]


def test_gpu_deploy_sets_the_inference_ami() -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    calls = Calls(sm)
    # moto's instance-type list has g4dn but not g5/g6.
    d = deployment(instance_type="ml.g4dn.xlarge", gpu=True, gpu_layers=None)
    endpoint.deploy(sm, d, now=NOW)
    [variant] = calls.params("CreateEndpointConfig")["ProductionVariants"]
    assert variant == {
        "VariantName": "AllTraffic",
        "ModelName": STAMPED,
        "InstanceType": "ml.g4dn.xlarge",
        "InitialInstanceCount": 1,
        "ContainerStartupHealthCheckTimeoutInSeconds": 600,
        "ModelDataDownloadTimeoutInSeconds": 600,
        "InferenceAmiVersion": CUDA13_AMI,
    }
    # moto keeps the field: what SageMaker would store.
    [stored] = sm.describe_endpoint_config(EndpointConfigName=STAMPED)["ProductionVariants"]
    assert stored["InferenceAmiVersion"] == CUDA13_AMI
    # --gpu offloads every layer unless --gpu-layers says otherwise.
    env = calls.params("CreateModel")["PrimaryContainer"]["Environment"]
    assert env["SM_LLAMA_CPP_N_GPU_LAYERS"] == "999"


def test_cpu_deploy_sends_no_ami() -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    calls = Calls(sm)
    endpoint.deploy(sm, deployment())
    [variant] = calls.params("CreateEndpointConfig")["ProductionVariants"]
    assert "InferenceAmiVersion" not in variant


def test_inference_ami_override() -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    calls = Calls(sm)
    older = "al2-ami-sagemaker-inference-gpu-3-1"
    d = deployment(instance_type="ml.g4dn.xlarge", gpu=True, inference_ami=older)
    endpoint.deploy(sm, d)
    [variant] = calls.params("CreateEndpointConfig")["ProductionVariants"]
    assert variant["InferenceAmiVersion"] == older


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"instance_type": "ml.g5.xlarge"}, "ml.g5.xlarge is a GPU instance: add --gpu"),
        ({"instance_type": "ml.g4dn.xlarge"}, "ml.g4dn.xlarge is a GPU instance: add --gpu"),
        ({"instance_type": "ml.c5.xlarge", "gpu": True}, "--gpu needs a GPU --instance-type"),
        ({"instance_type": "ml.p3.2xlarge", "gpu": True}, "CUDA 13 no longer supports"),
        ({"instance_type": "ml.inf2.xlarge"}, "Inferentia/Trainium"),
        ({"instance_type": "c5.xlarge"}, "--instance-type must look like ml.<family>.<size>"),
        (
            {"instance_type": "ml.c5.xlarge", "inference_ami": CUDA13_AMI},
            "--inference-ami applies to GPU instances",
        ),
        (
            {"instance_type": "ml.g5.xlarge", "gpu": True, "inference_ami": "al2-made-up"},
            "--inference-ami must be one of .*al2023-ami-sagemaker-inference-gpu-4-1",
        ),
    ],
)
def test_mismatches_are_refused_before_any_call(changes: dict, message: str) -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    calls = Calls(sm)
    with pytest.raises(DeployError, match=message):
        endpoint.deploy(sm, deployment(**changes))
    assert calls.made == []


@pytest.mark.parametrize(
    ("instance_type", "gpu"),
    [
        ("ml.g4dn.xlarge", True),
        ("ml.g5.2xlarge", True),
        ("ml.g6.xlarge", True),
        ("ml.g6e.12xlarge", True),
        ("ml.p4d.24xlarge", True),
        ("ml.p5.48xlarge", True),
        ("ml.c6i.xlarge", False),
        ("ml.m5.large", False),
        ("ml.c7i.2xlarge", False),
    ],
)
def test_gpu_families(instance_type: str, gpu: bool) -> None:
    assert instances.is_gpu(instance_type) is gpu


GRAVITON = ["ml.c7g.xlarge", "ml.m7g.large", "ml.r7g.2xlarge", "ml.c6g.large", "ml.m6g.xlarge"]
GRAVITON += ["ml.r6g.large", "ml.c6gn.xlarge", "ml.m6gd.large", "ml.r8g.large", "ml.c8g.large"]
GRAVITON += ["ml.g5g.xlarge", "ml.t4g.medium", "ml.x2gd.large", "ml.im4gn.large"]
AMD64 = ["ml.c6i.xlarge", "ml.c7i.2xlarge", "ml.m5.large", "ml.c5d.xlarge", "ml.m5dn.large"]
AMD64 += ["ml.c7a.large", "ml.g4dn.xlarge", "ml.g5.xlarge", "ml.g6e.xlarge", "ml.gr6.4xlarge"]
AMD64 += ["ml.p4de.24xlarge", "ml.p5en.48xlarge", "ml.inf2.xlarge", "ml.trn1n.32xlarge"]
AMD64 += ["ml.p6-b200.48xlarge", "ml.m7i-flex.large", "ml.r7iz.large", "ml.t3.medium"]


@pytest.mark.parametrize("instance_type", GRAVITON)
def test_arm64_types_are_refused_before_any_call(instance_type: str) -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    calls = Calls(sm)
    assert instances.is_arm64(instance_type)
    with pytest.raises(UsageError, match=r"is AWS Graviton \(arm64\).*amd64 only"):
        endpoint.deploy(sm, deployment(instance_type=instance_type))
    with pytest.raises(UsageError, match="amd64 only"):
        endpoint.deploy(sm, deployment(instance_type=instance_type, gpu=True))
    assert calls.made == []


@pytest.mark.parametrize("instance_type", AMD64)
def test_amd64_types_are_not_taken_for_arm64(instance_type: str) -> None:
    assert not instances.is_arm64(instance_type)


def test_deploy_command_refuses_a_mismatch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_client(*_: object) -> None:
        raise AssertionError("refused flags must not reach AWS")

    monkeypatch.setattr("semif_proxy.deploy.actions._client", no_client)
    args = ["deploy", "--image", deployment().image, "--model-data", "s3://m/model.tar.gz"]
    args += ["--role", ROLE]
    assert main([*args, "--instance-type", "ml.g5.xlarge"]) == 2
    assert "is a GPU instance: add --gpu" in capsys.readouterr().err
    assert main([*args, "--instance-type", "ml.c6i.xlarge", "--gpu"]) == 2
    assert "--gpu needs a GPU --instance-type" in capsys.readouterr().err
    # Graviton: the image is amd64 only. One line on stderr, exit 2, before any client.
    for arm in ("ml.c7g.xlarge", "ml.m6g.large", "ml.g5g.xlarge"):
        assert main([*args, "--instance-type", arm]) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert line == (
            f"semif-proxy deploy: --instance-type {arm} is AWS Graviton (arm64) and the "
            "semif-proxy image is amd64 only: use an Intel or AMD type (ml.c7i, ml.m7i, "
            "ml.r7i, ml.c6i, ml.m6i, ...)"
        )
    assert main([*args, "--instance-type", "ml.g5g.xlarge", "--gpu"]) == 2
    assert "AWS Graviton (arm64)" in capsys.readouterr().err
