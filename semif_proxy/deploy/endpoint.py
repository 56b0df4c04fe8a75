"""`semif-proxy deploy / invoke / delete`: a SageMaker model (network isolation on), endpoint
config (real-time or async; CPU, or GPU on the CUDA 13 AMI) and endpoint for a digest-pinned
image, then its autoscaling.

Every deploy makes a new model and endpoint config, both named <endpoint>-<UTC time to the ms>.
The first creates the endpoint; a later one updates it in place (UpdateEndpoint: SageMaker
starts the new fleet, moves the traffic, then stops the old one), waits for InService on the new
config, and then deletes the config the endpoint had before and that config's model (unless an
endpoint config named like the endpoint still uses it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from semif_proxy import progress
from semif_proxy.deploy import async_config, instances, model, names, scaling
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


def _not_found(exc: Any, what: str) -> bool:
    """SageMaker's answer for a missing resource: ValidationException 'Could not find <what>'."""
    return f"Could not find {what}" in exc.response.get("Error", {}).get("Message", "")


def describe_endpoint(sagemaker: Any, name: str) -> dict[str, Any] | None:
    """DescribeEndpoint's answer, or None when there is no such endpoint."""
    from botocore.exceptions import ClientError

    try:
        return sagemaker.describe_endpoint(EndpointName=name)
    except ClientError as exc:
        if _not_found(exc, "endpoint"):
            return None
        with aws_errors(f"describe endpoint {name!r}"):
            raise
    raise AssertionError("unreachable")


def describe_config(sagemaker: Any, name: str) -> dict[str, Any] | None:
    """DescribeEndpointConfig's answer, or None when there is no such endpoint config."""
    from botocore.exceptions import ClientError

    try:
        return sagemaker.describe_endpoint_config(EndpointConfigName=name)
    except ClientError as exc:
        if _not_found(exc, "endpoint config"):
            return None
        with aws_errors(f"describe endpoint config {name!r}"):
            raise
    raise AssertionError("unreachable")


def config_models(config: dict[str, Any]) -> list[str]:
    variants = config.get("ProductionVariants", []) + config.get("ShadowProductionVariants", [])
    return list(dict.fromkeys(v["ModelName"] for v in variants if v.get("ModelName")))


def models_in_use(sagemaker: Any, endpoint_name: str) -> dict[str, str]:
    """{model: an endpoint config that names it} over the endpoint configs whose names contain
    the endpoint's (every config deploy made for it; not the whole account, which may hold
    thousands)."""
    used: dict[str, str] = {}
    with aws_errors(f"list endpoint configs named like {endpoint_name!r}"):
        pages = sagemaker.get_paginator("list_endpoint_configs").paginate(
            NameContains=endpoint_name
        )
        config_names = [c["EndpointConfigName"] for p in pages for c in p["EndpointConfigs"]]
    for name in config_names:
        config = describe_config(sagemaker, name)
        for m in config_models(config or {}):
            used.setdefault(m, name)
    return used


_DELETE = {
    "endpoint": ("delete_endpoint", "EndpointName"),
    "endpoint config": ("delete_endpoint_config", "EndpointConfigName"),
    "model": ("delete_model", "ModelName"),
}


def delete_one(sagemaker: Any, what: str, name: str) -> bool:
    """Delete the endpoint, endpoint config or model `name`; False when there is none."""
    from botocore.exceptions import ClientError

    method, arg = _DELETE[what]
    try:
        getattr(sagemaker, method)(**{arg: name})
    except ClientError as exc:
        if _not_found(exc, what):
            return False
        with aws_errors(f"delete {what} {name!r}"):
            raise
    return True


# Endpoint states from which no update can start: in progress (wait), or Failed (delete).
_BUSY = ("Creating", "Updating", "SystemUpdating", "RollingBack", "Deleting")
_FAILED = ("Failed", "OutOfService", "UpdateRollbackFailed")


def require_updatable(current: dict[str, Any]) -> None:
    name, status = current["EndpointName"], current["EndpointStatus"]
    if status == "InService":
        return
    if status in _BUSY:
        raise DeployError(f"endpoint {name!r} is {status}: deploy again once it is InService")
    reason = current.get("FailureReason") or "no reason given"
    raise DeployError(
        f"endpoint {name!r} is {status} ({reason}): delete it first (semif-proxy delete "
        f"--endpoint {name}), then deploy"
    )


def create_version(sagemaker: Any, d: Deployment, version: str) -> None:
    """The model and endpoint config named `version`; neither is left behind on failure."""
    model.create(sagemaker, d.as_model(version))
    try:
        with aws_errors(f"create endpoint config {version!r}"):
            sagemaker.create_endpoint_config(**endpoint_config(d, version))
    except DeployError:
        discard(sagemaker, version)
        raise


def discard(sagemaker: Any, version: str) -> None:
    """Best effort: remove a model and endpoint config that no endpoint came to run."""
    for what in ("endpoint config", "model"):
        try:
            delete_one(sagemaker, what, version)
        except DeployError:
            pass  # the error being reported matters more; `delete` finds no stamped leftovers


def retire(
    sagemaker: Any, endpoint_name: str, config: str, models: list[str]
) -> tuple[list[str], list[str]]:
    """After an update: delete the endpoint config the endpoint ran before, then its models
    unless an endpoint config named like the endpoint still uses them. (removed, kept with why);
    a failure here leaves the deploy done, so it is reported, not raised."""
    removed: list[str] = []
    kept: list[str] = []
    try:
        if delete_one(sagemaker, "endpoint config", config):
            removed.append(f"endpoint config {config}")
    except DeployError as exc:
        kept.append(f"endpoint config {config} ({exc})")
    if not models:
        return removed, kept
    try:
        in_use = models_in_use(sagemaker, endpoint_name)
    except DeployError as exc:
        kept += [f"model {m} (cannot tell whether another config uses it: {exc})" for m in models]
        return removed, kept
    for m in models:
        if m in in_use:
            kept.append(f"model {m} (endpoint config {in_use[m]} uses it)")
            continue
        try:
            if delete_one(sagemaker, "model", m):
                removed.append(f"model {m}")
        except DeployError as exc:
            kept.append(f"model {m} ({exc})")
    return removed, kept


def wait_in_service(
    sagemaker: Any,
    name: str,
    timeout: float = 3600,
    interval: float = 30,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Poll until InService, writing each change of status with the time elapsed."""
    status_line = progress.Status(f"endpoint {name}")

    def step() -> tuple[bool, Any]:
        with aws_errors(f"describe endpoint {name!r}"):
            desc = sagemaker.describe_endpoint(EndpointName=name)
        status = desc["EndpointStatus"]
        status_line.update(status)
        if status in (*_FAILED, "Deleting"):
            reason = desc.get("FailureReason", "no reason given")
            raise DeployError(
                f"endpoint {name!r} is {status}: {reason} (container logs: CloudWatch "
                f"/aws/sagemaker/Endpoints/{name})"
            )
        return status == "InService", desc if status == "InService" else status

    return poll(step, f"endpoint {name!r}", timeout, interval, sleep)


def _changes_instance_type(old_config: dict[str, Any] | None, d: Deployment) -> bool:
    if old_config is None:
        return True
    return any(v.get("InstanceType") != d.instance_type for v in old_config["ProductionVariants"])


def deploy(
    sagemaker: Any,
    d: Deployment,
    wait: Callable[[Any, str], dict[str, Any]] = wait_in_service,
    autoscaling: Any = None,
    cloudwatch: Any = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """A new model and endpoint config (named stamped(d.name)), then the endpoint created, or
    updated in place when it exists; wait for InService on the new config; after an update the
    old config and model deleted (what cannot be is reported, not raised: the update is done);
    then autoscaling as the flags say (AWS registers a variant only once its endpoint is in
    service). The description gets "ModelName" and, where there is something to say,
    "Autoscaling", "Removed" and "Kept" (lists of lines).

    On an existing endpoint, given the autoscaling and CloudWatch clients, its autoscaling is
    removed (before the update when the instance type changes, which AWS refuses otherwise) and
    set again only if d.scaling says so: a deploy's flags are the endpoint's settings."""
    check(d)
    if d.scaling is not None and autoscaling is None:
        raise DeployError("autoscaling needs an application-autoscaling client")
    version = names.stamped(d.name, now)
    current = describe_endpoint(sagemaker, d.name)
    old_name: str | None = None
    old_config: dict[str, Any] | None = None
    if current is not None:
        require_updatable(current)
        old_name = current["EndpointConfigName"]
        old_config = describe_config(sagemaker, old_name)
    manage_scaling = current is not None and autoscaling is not None and cloudwatch is not None
    create_version(sagemaker, d, version)
    unscaled: list[str] = []
    scaling_removed = False
    try:
        if current is None:
            progress.note(
                f"endpoint {d.name}: creating on endpoint config {version} (model {version})"
            )
            with aws_errors(f"create endpoint {d.name!r}"):
                sagemaker.create_endpoint(EndpointName=d.name, EndpointConfigName=version)
        else:
            if manage_scaling and _changes_instance_type(old_config, d):
                unscaled = scaling.remove(autoscaling, cloudwatch, d.name)
                scaling_removed = True
            progress.note(
                f"endpoint {d.name}: updating from endpoint config {old_name} to {version} "
                f"(model {version})"
            )
            with aws_errors(f"update endpoint {d.name!r} to endpoint config {version!r}"):
                sagemaker.update_endpoint(EndpointName=d.name, EndpointConfigName=version)
    except DeployError:
        discard(sagemaker, version)
        raise
    desc = dict(wait(sagemaker, d.name))
    if desc.get("EndpointConfigName") != version:  # a failed update rolls back to the old one
        discard(sagemaker, version)
        lost = "; its autoscaling was removed for the update" if unscaled else ""
        raise DeployError(
            f"endpoint {d.name!r} did not take endpoint config {version!r}: "
            f"{desc.get('FailureReason') or 'no reason given'}; it still runs "
            f"{desc.get('EndpointConfigName')!r}{lost} (container logs: CloudWatch "
            f"/aws/sagemaker/Endpoints/{d.name})"
        )
    desc["ModelName"] = version
    if old_name is not None:
        models = [m for m in config_models(old_config or {}) if m != version]
        desc["Removed"], desc["Kept"] = retire(sagemaker, d.name, old_name, models)
    if manage_scaling and not scaling_removed:
        try:
            unscaled = scaling.remove(autoscaling, cloudwatch, d.name)
        except DeployError as exc:
            if d.scaling is not None:
                raise
            desc["Autoscaling"] = [f"left as it was: {exc}"]  # the update itself is done
    if d.scaling is not None:
        desc["Autoscaling"] = scaling.apply(
            autoscaling, cloudwatch, d.name, d.scaling, d.async_output is not None
        )
    elif unscaled:
        desc["Autoscaling"] = ["removed (no autoscaling flags given)"]
    return desc


def invoke(runtime: Any, name: str, body: bytes) -> tuple[str, bytes]:
    with aws_errors(f"invoke endpoint {name!r}"):
        reply = runtime.invoke_endpoint(
            EndpointName=name, ContentType="application/json", Accept="application/json", Body=body
        )
    return reply.get("ContentType", ""), reply["Body"].read()


def delete(sagemaker: Any, name: str, autoscaling: Any = None, cloudwatch: Any = None) -> list[str]:
    """The endpoint, the endpoint config it runs, that config's models (unless an endpoint
    config named like the endpoint still uses them), and a config and model named like the
    endpoint itself (as deploy named them before it stamped names); then (given the clients) its
    autoscaling registration and scale-from-zero alarm; each one that exists. What was deleted,
    as lines."""
    current = describe_endpoint(sagemaker, name)
    configs = list(dict.fromkeys([*([current["EndpointConfigName"]] if current else []), name]))
    models: list[str] = []
    for config_name in configs:
        models += config_models(describe_config(sagemaker, config_name) or {})
    models = list(dict.fromkeys([*models, name]))
    removed = []
    if current is not None and delete_one(sagemaker, "endpoint", name):
        removed.append(f"endpoint {name}")
    for config_name in configs:
        if delete_one(sagemaker, "endpoint config", config_name):
            removed.append(f"endpoint config {config_name}")
    in_use = models_in_use(sagemaker, name)
    for m in models:
        if m in in_use:
            removed.append(f"not model {m} (endpoint config {in_use[m]} uses it)")
        elif delete_one(sagemaker, "model", m):
            removed.append(f"model {m}")
    if autoscaling is not None and cloudwatch is not None:
        try:
            removed += scaling.remove(autoscaling, cloudwatch, name)
        except DeployError as exc:  # the endpoint is gone; say what was left
            removed.append(f"not its autoscaling settings ({exc})")
    if not removed:
        raise DeployError(f"nothing named {name!r} to delete (endpoint, config or model)")
    return removed
