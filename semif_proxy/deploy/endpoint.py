"""`semif-proxy deploy / invoke / delete`: a SageMaker model (network isolation on), endpoint
config (real-time or async; CPU, or GPU on the CUDA 13 AMI) and endpoint for a digest-pinned
image, then its autoscaling."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from semif_proxy.deploy import async_config, instances, model, scaling
from semif_proxy.deploy.async_config import AsyncOutput
from semif_proxy.deploy.errors import DeployError, aws_errors, poll
from semif_proxy.deploy.names import VARIANT
from semif_proxy.deploy.scaling import Scaling

# Large GGUFs take minutes to download and load; SageMaker's defaults are shorter.
MIN_TIMEOUT_S = 600
ALL_LAYERS = 999  # SM_LLAMA_CPP_N_GPU_LAYERS with --gpu unless --gpu-layers says otherwise


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
    gpu: bool = False
    inference_ami: str | None = None  # GPU only; default instances.DEFAULT_GPU_AMI
    async_output: AsyncOutput | None = None  # set: an asynchronous endpoint
    scaling: Scaling | None = None

    def as_model(self) -> model.Model:
        layers = self.gpu_layers
        if layers is None and self.gpu:
            layers = ALL_LAYERS
        return model.Model(
            self.name, self.image, self.model_data, self.role_arn, layers, dict(self.env)
        )


def check(d: Deployment) -> None:
    """Everything that can be refused without asking AWS."""
    model.check(d.as_model())
    if min(d.startup_timeout, d.download_timeout) < MIN_TIMEOUT_S:
        raise DeployError(f"start-up and download timeouts must be at least {MIN_TIMEOUT_S}s")
    instances.check(d.instance_type, d.gpu)
    instances.inference_ami(d.instance_type, d.inference_ami)
    if d.instance_count < 1:
        raise DeployError(f"the instance count must be at least 1, got {d.instance_count}")
    if d.async_output is not None:
        async_config.check(d.async_output)
    if d.scaling is not None:
        scaling.check(d.scaling, asynchronous=d.async_output is not None)


def initial_count(d: Deployment) -> int:
    """With autoscaling, start at its minimum (at least 1: an async endpoint that may scale to
    zero starts with one instance and scales in when idle)."""
    return max(1, d.scaling.min_instances) if d.scaling else d.instance_count


def variant(d: Deployment) -> dict[str, Any]:
    out: dict[str, Any] = {
        "VariantName": VARIANT,
        "ModelName": d.name,
        "InstanceType": d.instance_type,
        "InitialInstanceCount": initial_count(d),
        "ContainerStartupHealthCheckTimeoutInSeconds": d.startup_timeout,
        "ModelDataDownloadTimeoutInSeconds": d.download_timeout,
    }
    ami = instances.inference_ami(d.instance_type, d.inference_ami)
    if ami is not None:
        out["InferenceAmiVersion"] = ami
    return out


def endpoint_config(d: Deployment) -> dict[str, Any]:
    out: dict[str, Any] = {"EndpointConfigName": d.name, "ProductionVariants": [variant(d)]}
    if d.async_output is not None:
        out["AsyncInferenceConfig"] = async_config.config(d.async_output)
    return out


def create(sagemaker: Any, d: Deployment) -> None:
    check(d)
    model.create(sagemaker, d.as_model())
    with aws_errors(f"create endpoint config {d.name!r}"):
        sagemaker.create_endpoint_config(**endpoint_config(d))
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
    autoscaling: Any = None,
    cloudwatch: Any = None,
) -> dict[str, Any]:
    """Model, config, endpoint; wait for InService; then autoscaling if asked (AWS registers a
    variant only once its endpoint is in service). The description gets "Autoscaling", a list
    of what was set."""
    check(d)
    if d.scaling is not None and autoscaling is None:
        raise DeployError("autoscaling needs an application-autoscaling client")
    create(sagemaker, d)
    desc = dict(wait(sagemaker, d.name))
    if d.scaling is not None:
        desc["Autoscaling"] = scaling.apply(
            autoscaling, cloudwatch, d.name, d.scaling, d.async_output is not None
        )
    return desc


def invoke(runtime: Any, name: str, body: bytes) -> tuple[str, bytes]:
    with aws_errors(f"invoke endpoint {name!r}"):
        reply = runtime.invoke_endpoint(
            EndpointName=name, ContentType="application/json", Accept="application/json", Body=body
        )
    return reply.get("ContentType", ""), reply["Body"].read()


def delete(sagemaker: Any, name: str, autoscaling: Any = None, cloudwatch: Any = None) -> list[str]:
    """Endpoint, then its config, then the model, then (given the clients) its autoscaling
    registration and scale-from-zero alarm; each one that exists."""
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
    if autoscaling is not None and cloudwatch is not None:
        try:
            removed += scaling.remove(autoscaling, cloudwatch, name)
        except DeployError as exc:  # the endpoint is gone; say what was left
            removed.append(f"not its autoscaling settings ({exc})")
    if not removed:
        raise DeployError(f"nothing named {name!r} to delete (endpoint, config or model)")
    return removed
