"""`deploy` on an endpoint that exists: a new stamped model and endpoint config, UpdateEndpoint,
InService on the new config, then the old config and model deleted; the status lines on stderr.

moto (5.2) does not implement UpdateEndpoint ("The update_endpoint action has not been
implemented"). `FakeUpdate` answers that one call, before it would reach moto, by switching the
endpoint moto stores to the new config; every other call is moto's own."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from moto.core import DEFAULT_ACCOUNT_ID
from moto.sagemaker.models import sagemaker_backends

from semif_proxy.cli import main
from semif_proxy.deploy import endpoint
from semif_proxy.deploy.deployment import variant as production_variant
from semif_proxy.deploy.errors import DeployError
from semif_proxy.deploy.scaling import Scaling
from tests.test_deploy import (  # noqa: F401 (aws: autouse)
    NOW,
    REGION,
    ROLE,
    STAMPED,
    Calls,
    aws,
    deployment,
)

LATER = NOW + timedelta(minutes=5)
RESTAMPED = "semif-ep-20260301-123545-123"  # what a deploy at LATER makes
STATUS = re.compile(r"endpoint semif-ep: (\w+) \(\d+m\d\ds\)")


def backend() -> Any:
    return sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION]


class FakeUpdate:
    """UpdateEndpoint on moto's stored endpoint. at_once: InService at once (the commands wait
    30 s between polls); else Updating until finish() or roll_back()."""

    def __init__(self, session: boto3.session.Session, at_once: bool = True) -> None:
        self.at_once = at_once
        self.requests: list[dict[str, Any]] = []
        self.previous: str | None = None
        session.events.register("before-call.sagemaker.UpdateEndpoint", self)

    def __call__(self, params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        body = json.loads(params["body"])
        self.requests.append(body)
        ep = backend().endpoints.get(body["EndpointName"])
        config = backend().endpoint_configs.get(body["EndpointConfigName"])
        if ep is None or config is None:
            error = {"Code": "ValidationException", "Message": "Could not find it"}
            return AWSResponse("https://sagemaker", 400, {}, None), {"Error": error}
        self.previous = ep.endpoint_config_name
        ep.endpoint_config_name = config.endpoint_config_name
        ep.production_variants = ep._process_production_variants(config.production_variants)
        ep.endpoint_status = "InService" if self.at_once else "Updating"
        return AWSResponse("https://sagemaker", 200, {}, None), {"EndpointArn": ep.arn}

    def finish(self) -> None:
        backend().endpoints["semif-ep"].endpoint_status = "InService"

    def roll_back(self, reason: str) -> None:
        ep = backend().endpoints["semif-ep"]
        ep.endpoint_config_name = self.previous
        ep.endpoint_status = "InService"
        ep.failure_reason = reason


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> boto3.session.Session:
    """boto3's default session for this test: every client, the commands' own too, comes from
    it and so gets the handlers registered on it."""
    s = boto3.session.Session(region_name=REGION)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", s)
    return s


def wait_then(action: Any) -> Any:
    """A wait whose first sleep is the time SageMaker takes: `action` happens then."""

    def wait(sm: Any, name: str) -> dict[str, Any]:
        return endpoint.wait_in_service(sm, name, interval=0, sleep=lambda _: action())

    return wait


def test_second_deploy_updates_in_place(
    session: boto3.session.Session, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeUpdate(session, at_once=False)
    sm = boto3.client("sagemaker")
    first = endpoint.deploy(sm, deployment(), now=NOW)
    assert (first["EndpointConfigName"], first["ModelName"]) == (STAMPED, STAMPED)
    capsys.readouterr()
    calls = Calls(sm)
    d = deployment(model_data="s3://models/semif-v2/model.tar.gz")
    desc = endpoint.deploy(sm, d, wait=wait_then(fake.finish), now=LATER)

    assert calls.names() == [
        "DescribeEndpoint",  # it exists and is InService: update it
        "DescribeEndpointConfig",  # the old config: its models, its instance type
        "CreateModel",
        "CreateEndpointConfig",
        "UpdateEndpoint",
        "DescribeEndpoint",
        "DescribeEndpoint",
        "DeleteEndpointConfig",
        "ListEndpointConfigs",  # does another config still name the old model?
        "DescribeEndpointConfig",
        "DeleteModel",
    ]
    assert fake.requests == [{"EndpointName": "semif-ep", "EndpointConfigName": RESTAMPED}]
    model = calls.params("CreateModel")
    assert model["ModelName"] == RESTAMPED
    assert model["PrimaryContainer"]["ModelDataUrl"] == "s3://models/semif-v2/model.tar.gz"
    [variant] = calls.params("CreateEndpointConfig")["ProductionVariants"]
    assert variant["ModelName"] == RESTAMPED
    assert calls.params("DeleteEndpointConfig") == {"EndpointConfigName": STAMPED}
    assert calls.params("DeleteModel") == {"ModelName": STAMPED}
    assert desc["EndpointConfigName"] == desc["ModelName"] == RESTAMPED
    assert desc["EndpointStatus"] == "InService"
    assert desc["Removed"] == [f"endpoint config {STAMPED}", f"model {STAMPED}"]
    assert desc["Kept"] == []
    # What is left: the endpoint on the new config and model, nothing of the old ones.
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == [RESTAMPED]
    configs = sm.list_endpoint_configs()["EndpointConfigs"]
    assert [c["EndpointConfigName"] for c in configs] == [RESTAMPED]
    assert sm.describe_endpoint(EndpointName="semif-ep")["EndpointConfigName"] == RESTAMPED
    # stderr: what it waits for, named before the first status line; then each change.
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        f"endpoint semif-ep: updating from endpoint config {STAMPED} to {RESTAMPED} "
        f"(model {RESTAMPED})"
    )
    assert [STATUS.fullmatch(line).group(1) for line in lines[1:]] == ["Updating", "InService"]


def test_first_deploy_names_the_endpoint_before_waiting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    endpoint.deploy(sm, deployment(), now=NOW)
    assert capsys.readouterr().err.splitlines() == [
        f"endpoint semif-ep: creating on endpoint config {STAMPED} (model {STAMPED})",
        "endpoint semif-ep: InService (0m00s)",
    ]


def test_an_old_model_another_config_uses_is_kept(session: boto3.session.Session) -> None:
    FakeUpdate(session)
    sm = boto3.client("sagemaker")
    endpoint.deploy(sm, deployment(), now=NOW)
    variant = production_variant(deployment(), STAMPED)
    sm.create_endpoint_config(EndpointConfigName="semif-ep-canary", ProductionVariants=[variant])
    desc = endpoint.deploy(sm, deployment(), now=LATER)
    assert desc["Removed"] == [f"endpoint config {STAMPED}"]
    assert desc["Kept"] == [f"model {STAMPED} (endpoint config semif-ep-canary uses it)"]
    assert sorted(m["ModelName"] for m in sm.list_models()["Models"]) == [STAMPED, RESTAMPED]


def test_an_endpoint_deployed_before_names_were_stamped(session: boto3.session.Session) -> None:
    """Model, config and endpoint all named like the endpoint (as deploy made them before):
    updated like any other, and its old config and model go."""
    FakeUpdate(session)
    sm = boto3.client("sagemaker")
    d = deployment()
    sm.create_model(ModelName="semif-ep", ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "i"})
    variants = [production_variant(d, "semif-ep")]
    sm.create_endpoint_config(EndpointConfigName="semif-ep", ProductionVariants=variants)
    sm.create_endpoint(EndpointName="semif-ep", EndpointConfigName="semif-ep")
    desc = endpoint.deploy(sm, d, now=LATER)
    assert desc["Removed"] == ["endpoint config semif-ep", "model semif-ep"]
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == [RESTAMPED]


def test_a_failed_update_rolls_back_and_leaves_nothing_new(
    session: boto3.session.Session, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeUpdate(session, at_once=False)
    sm = boto3.client("sagemaker")
    endpoint.deploy(sm, deployment(), now=NOW)
    reason = "The primary container for production variant AllTraffic did not pass the ping"
    with pytest.raises(DeployError) as failed:
        endpoint.deploy(sm, deployment(), wait=wait_then(lambda: fake.roll_back(reason)), now=LATER)
    assert str(failed.value) == (
        f"endpoint 'semif-ep' did not take endpoint config '{RESTAMPED}': {reason}; it still "
        f"runs '{STAMPED}' (container logs: CloudWatch /aws/sagemaker/Endpoints/semif-ep)"
    )
    # The endpoint runs the old config and model; the new ones are gone.
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == [STAMPED]
    configs = sm.list_endpoint_configs()["EndpointConfigs"]
    assert [c["EndpointConfigName"] for c in configs] == [STAMPED]
    assert "endpoint semif-ep: Updating" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ("Updating", "endpoint 'semif-ep' is Updating: deploy again once it is InService"),
        ("Creating", "is Creating: deploy again once it is InService"),
        ("Failed", r"is Failed \(bad image\): delete it first \(semif-proxy delete --endpoint"),
    ],
)
def test_an_endpoint_that_cannot_be_updated_now_is_refused(status: str, message: str) -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    endpoint.deploy(sm, deployment(), now=NOW)
    backend().endpoints["semif-ep"].endpoint_status = status
    backend().endpoints["semif-ep"].failure_reason = "bad image"
    calls = Calls(sm)
    with pytest.raises(DeployError, match=message):
        endpoint.deploy(sm, deployment(), now=LATER)
    assert calls.names() == ["DescribeEndpoint"]  # nothing created


def test_update_with_autoscaling(session: boto3.session.Session) -> None:
    """AWS refuses an update that changes the instance type of a variant registered with
    Application Auto Scaling: deregistered first then. The flags of each deploy are the
    endpoint's settings: registered again with them, or left off without them."""
    FakeUpdate(session)
    sm, aas, cw = (boto3.client(s) for s in ("sagemaker", "application-autoscaling", "cloudwatch"))
    scaled = Scaling(1, 4, target_invocations=60)
    endpoint.deploy(sm, deployment(scaling=scaled), autoscaling=aas, cloudwatch=cw, now=NOW)

    calls = Calls(sm, aas, cw)
    other_type = deployment(
        scaling=Scaling(2, 5, target_invocations=60), instance_type="ml.m5.large"
    )
    desc = endpoint.deploy(sm, other_type, autoscaling=aas, cloudwatch=cw, now=LATER)
    names = calls.names()
    assert names.index("DeregisterScalableTarget") < names.index("UpdateEndpoint")
    assert names.index("UpdateEndpoint") < names.index("RegisterScalableTarget")
    assert names.count("DeregisterScalableTarget") == 1
    assert desc["Autoscaling"] == ["2-5 instances", "target 60 invocations per instance per minute"]
    [target] = aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["MinCapacity"], target["MaxCapacity"]) == (2, 5)

    # Same type, no autoscaling flags: the update goes on under autoscaling, which is then removed.
    calls = Calls(sm, aas, cw)
    third = LATER + timedelta(minutes=5)
    desc = endpoint.deploy(
        sm, deployment(instance_type="ml.m5.large"), autoscaling=aas, cloudwatch=cw, now=third
    )
    names = calls.names()
    assert names.index("UpdateEndpoint") < names.index("DeregisterScalableTarget")
    assert "RegisterScalableTarget" not in names
    assert desc["Autoscaling"] == ["removed (no autoscaling flags given)"]
    assert aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []


def test_deploy_command_twice(
    session: boto3.session.Session, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command itself, twice: the second updates the endpoint in place."""
    FakeUpdate(session)
    args = ["deploy", "--image", deployment().image, "--model-data", "s3://m/model.tar.gz"]
    args += ["--role", ROLE, "--instance-type", "ml.c5.xlarge", "--name", "semif-ep"]
    assert main(args) == 0
    first = capsys.readouterr()
    v1 = first.out.splitlines()[1].rpartition(" model ")[2]
    assert first.out.splitlines() == ["semif-ep InService", f"endpoint config {v1}, model {v1}"]
    assert main(args) == 0
    second = capsys.readouterr()
    v2 = second.out.splitlines()[1].rpartition(" model ")[2]
    assert v2 != v1 and re.fullmatch(r"semif-ep-\d{8}-\d{6}-\d{3}", v2)
    assert second.out.splitlines() == [
        "semif-ep InService",
        f"endpoint config {v2}, model {v2}",
        f"removed: endpoint config {v1}, model {v1}",
    ]
    # stderr: the name line before the first status line.
    assert second.err.splitlines() == [
        f"endpoint semif-ep: updating from endpoint config {v1} to {v2} (model {v2})",
        "endpoint semif-ep: InService (0m00s)",
    ]
    assert main(["delete", "--endpoint", "semif-ep"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"deleted endpoint semif-ep, endpoint config {v2}, model {v2}"
    )
    sm = boto3.client("sagemaker")
    assert sm.list_models()["Models"] == [] and sm.list_endpoints()["Endpoints"] == []


def test_deploy_command_prints_the_failure_reason(
    session: boto3.session.Session, capsys: pytest.CaptureFixture[str]
) -> None:
    """An endpoint that fails to start: the command says which, its status line, then
    SageMaker's FailureReason and where the container's log is."""
    reason = "The primary container for production variant AllTraffic did not pass the ping"

    def fail(**_: Any) -> None:
        ep = backend().endpoints["semif-ep"]
        ep.endpoint_status, ep.failure_reason = "Failed", reason

    session.events.register("after-call.sagemaker.CreateEndpoint", fail)
    args = ["deploy", "--image", deployment().image, "--model-data", "s3://m/model.tar.gz"]
    args += ["--role", ROLE, "--instance-type", "ml.c5.xlarge", "--name", "semif-ep"]
    assert main(args) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("endpoint semif-ep: creating on endpoint config semif-ep-")
    assert lines[1] == "endpoint semif-ep: Failed (0m00s)"
    assert lines[2] == (
        f"semif-proxy deploy: endpoint 'semif-ep' is Failed: {reason} (container logs: "
        "CloudWatch /aws/sagemaker/Endpoints/semif-ep)"
    )
    assert len(lines) == 3


def test_stamped_names_fit_the_63_characters() -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    desc = endpoint.deploy(sm, deployment(name="e" * 63), now=NOW)
    assert desc["ModelName"] == desc["EndpointConfigName"] == "e" * 43 + "-20260301-123045-123"
    assert desc["EndpointName"] == "e" * 63
