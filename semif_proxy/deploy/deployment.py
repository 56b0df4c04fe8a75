"""What one `semif-proxy deploy` asks for (a Deployment), everything about it that can be
refused without asking AWS, and the SageMaker model and endpoint config it makes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from semif_proxy.deploy import async_config, instances, model, scaling
from semif_proxy.deploy.async_config import AsyncOutput
from semif_proxy.deploy.errors import DeployError
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

    def as_model(self, name: str | None = None) -> model.Model:
        """The model to run, named `name` (deploy: its stamped name; default: the endpoint's)."""
        layers = self.gpu_layers
        if layers is None and self.gpu:
            layers = ALL_LAYERS
        return model.Model(
            name or self.name, self.image, self.model_data, self.role_arn, layers, dict(self.env)
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


def variant(d: Deployment, model_name: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "VariantName": VARIANT,
        "ModelName": model_name,
        "InstanceType": d.instance_type,
        "InitialInstanceCount": initial_count(d),
        "ContainerStartupHealthCheckTimeoutInSeconds": d.startup_timeout,
        "ModelDataDownloadTimeoutInSeconds": d.download_timeout,
    }
    ami = instances.inference_ami(d.instance_type, d.inference_ami)
    if ami is not None:
        out["InferenceAmiVersion"] = ami
    return out


def endpoint_config(d: Deployment, version: str) -> dict[str, Any]:
    """The endpoint config named `version`, running the model of the same name."""
    out: dict[str, Any] = {
        "EndpointConfigName": version,
        "ProductionVariants": [variant(d, version)],
    }
    if d.async_output is not None:
        out["AsyncInferenceConfig"] = async_config.config(d.async_output)
    return out
