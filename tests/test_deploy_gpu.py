"""GPU deploys: the CUDA 13 image needs NVIDIA driver >= 580, so a GPU variant gets the
InferenceAmiVersion with that driver; CPU/GPU mismatches are refused before any AWS call."""

from __future__ import annotations

import boto3
import botocore.session
import pytest

from semif_proxy.cli import main
from semif_proxy.deploy import endpoint, instances
from semif_proxy.deploy.errors import DeployError
from tests.test_deploy import REGION, ROLE, Calls, aws, deployment  # noqa: F401 (aws: autouse)

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
    endpoint.deploy(sm, deployment(instance_type="ml.g4dn.xlarge", gpu=True, gpu_layers=None))
    [variant] = calls.params("CreateEndpointConfig")["ProductionVariants"]
    assert variant == {
        "VariantName": "AllTraffic",
        "ModelName": "semif-ep",
        "InstanceType": "ml.g4dn.xlarge",
        "InitialInstanceCount": 1,
        "ContainerStartupHealthCheckTimeoutInSeconds": 600,
        "ModelDataDownloadTimeoutInSeconds": 600,
        "InferenceAmiVersion": CUDA13_AMI,
    }
    # moto keeps the field: what SageMaker would store.
    [stored] = sm.describe_endpoint_config(EndpointConfigName="semif-ep")["ProductionVariants"]
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


def test_deploy_command_refuses_a_mismatch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_client(*_: object) -> None:
        raise AssertionError("refused flags must not reach AWS")

    monkeypatch.setattr("semif_proxy.deploy.cli._client", no_client)
    args = ["deploy", "--image", deployment().image, "--model-data", "s3://m/model.tar.gz"]
    args += ["--role", ROLE]
    assert main([*args, "--instance-type", "ml.g5.xlarge"]) == 1
    assert "is a GPU instance: add --gpu" in capsys.readouterr().err
    assert main([*args, "--instance-type", "ml.c6i.xlarge", "--gpu"]) == 1
    assert "--gpu needs a GPU --instance-type" in capsys.readouterr().err
