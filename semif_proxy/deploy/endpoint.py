"""`semif-proxy deploy / invoke / delete`: a SageMaker model (network isolation on), endpoint
config (real-time or async; CPU, or GPU on the CUDA 13 AMI) and endpoint for a digest-pinned
image, then its autoscaling.

Every deploy makes a new model and endpoint config, both named <endpoint>-<UTC time to the ms>.
The first creates the endpoint; a later one updates it in place (UpdateEndpoint: SageMaker
starts the new fleet, moves the traffic, then stops the old one), waits for InService on the new
config, and then deletes the config the endpoint had before and that config's model (unless an
endpoint config named like the endpoint still uses it).

What is deployed, with the model and endpoint config it makes: deployment.py. Describing and
deleting one resource: resources.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from semif_proxy import progress
from semif_proxy.deploy import model, names, scaling
from semif_proxy.deploy.deployment import Deployment, check, endpoint_config
from semif_proxy.deploy.errors import DeployError, aws_errors, poll
from semif_proxy.deploy.resources import (
    config_models,
    delete_one,
    describe_config,
    describe_endpoint,
    models_in_use,
)

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
