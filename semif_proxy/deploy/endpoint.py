"""`semif-proxy deploy / invoke / delete`: a SageMaker model (network isolation on), endpoint
config and endpoint for a digest-pinned image."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from semif_proxy.deploy import s3uri
from semif_proxy.deploy.errors import DeployError, aws_errors, poll
from semif_proxy.deploy.image import require_digest

# Large GGUFs take minutes to download and load; SageMaker's defaults are shorter.
MIN_TIMEOUT_S = 600


@dataclass(frozen=True)
class Deployment:
    name: str
    image: str
    model_data: str
    role_arn: str
    instance_type: str = "ml.c6i.xlarge"
    instance_count: int = 1
    gpu_layers: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout: int = MIN_TIMEOUT_S
    download_timeout: int = MIN_TIMEOUT_S


def container_env(d: Deployment) -> dict[str, str]:
    env = {"SM_LLAMA_CPP_MODEL_DIR": "/opt/ml/model", **d.env}
    if d.gpu_layers is not None:
        env["SM_LLAMA_CPP_N_GPU_LAYERS"] = str(d.gpu_layers)
    return env


def check(d: Deployment) -> None:
    require_digest(d.image, "the image")
    s3uri.parse(d.model_data)
    if not d.model_data.endswith(".tar.gz"):
        raise DeployError(f"model data must be a model.tar.gz, got {d.model_data!r}")
    if min(d.startup_timeout, d.download_timeout) < MIN_TIMEOUT_S:
        raise DeployError(f"start-up and download timeouts must be at least {MIN_TIMEOUT_S}s")


def create(sagemaker: Any, d: Deployment) -> None:
    check(d)
    with aws_errors(f"create SageMaker model {d.name!r}"):
        sagemaker.create_model(
            ModelName=d.name,
            ExecutionRoleArn=d.role_arn,
            PrimaryContainer={
                "Image": d.image,
                "ModelDataUrl": d.model_data,
                "Environment": container_env(d),
            },
            EnableNetworkIsolation=True,
        )
    with aws_errors(f"create endpoint config {d.name!r}"):
        sagemaker.create_endpoint_config(
            EndpointConfigName=d.name,
            ProductionVariants=[
                {
                    "VariantName": "AllTraffic",
                    "ModelName": d.name,
                    "InstanceType": d.instance_type,
                    "InitialInstanceCount": d.instance_count,
                    "ContainerStartupHealthCheckTimeoutInSeconds": d.startup_timeout,
                    "ModelDataDownloadTimeoutInSeconds": d.download_timeout,
                }
            ],
        )
    with aws_errors(f"create endpoint {d.name!r}"):
        sagemaker.create_endpoint(EndpointName=d.name, EndpointConfigName=d.name)


def wait_in_service(
    sagemaker: Any,
    name: str,
    timeout: float = 3600,
    interval: float = 30,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    def step() -> tuple[bool, Any]:
        with aws_errors(f"describe endpoint {name!r}"):
            desc = sagemaker.describe_endpoint(EndpointName=name)
        status = desc["EndpointStatus"]
        if status in ("Failed", "OutOfService", "Deleting"):
            reason = desc.get("FailureReason", "no reason given")
            raise DeployError(
                f"endpoint {name!r} is {status}: {reason} (container logs: CloudWatch "
                f"/aws/sagemaker/Endpoints/{name})"
            )
        return status == "InService", desc if status == "InService" else status

    return poll(step, f"endpoint {name!r}", timeout, interval, sleep)


def deploy(
    sagemaker: Any,
    d: Deployment,
    wait: Callable[[Any, str], dict[str, Any]] = wait_in_service,
) -> dict[str, Any]:
    create(sagemaker, d)
    return wait(sagemaker, d.name)


def invoke(runtime: Any, name: str, body: bytes) -> tuple[str, bytes]:
    with aws_errors(f"invoke endpoint {name!r}"):
        reply = runtime.invoke_endpoint(
            EndpointName=name, ContentType="application/json", Accept="application/json", Body=body
        )
    return reply.get("ContentType", ""), reply["Body"].read()


def delete(sagemaker: Any, name: str) -> list[str]:
    """Endpoint, then its config, then the model; each one that exists."""
    removed = []
    for what, call, arg in (
        ("endpoint", sagemaker.delete_endpoint, {"EndpointName": name}),
        ("endpoint config", sagemaker.delete_endpoint_config, {"EndpointConfigName": name}),
        ("model", sagemaker.delete_model, {"ModelName": name}),
    ):
        try:
            with aws_errors(f"delete {what} {name!r}"):
                call(**arg)
            removed.append(what)
        except DeployError as exc:
            if "Could not find" not in str(exc) and "ValidationException" not in str(exc):
                raise
    if not removed:
        raise DeployError(f"nothing named {name!r} to delete (endpoint, config or model)")
    return removed
