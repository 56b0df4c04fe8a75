"""Autoscaling and asynchronous endpoints against moto (SageMaker, Application Auto Scaling,
CloudWatch): the exact parameters registered, and every bad combination refused before any
AWS call."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from semif_proxy.cli import main
from semif_proxy.deploy import endpoint, scaling
from semif_proxy.deploy.async_config import AsyncOutput
from semif_proxy.deploy.errors import DeployError
from semif_proxy.deploy.scaling import Scaling
from tests.test_deploy import REGION, ROLE, Calls, aws, deployment  # noqa: F401 (aws: autouse)

RESOURCE = "endpoint/semif-ep/variant/AllTraffic"
TARGET = {
    "ServiceNamespace": "sagemaker",
    "ResourceId": RESOURCE,
    "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
}


def clients() -> tuple[Any, Any, Any, Calls]:
    sm = boto3.client("sagemaker", region_name=REGION)
    aas = boto3.client("application-autoscaling", region_name=REGION)
    cw = boto3.client("cloudwatch", region_name=REGION)
    return sm, aas, cw, Calls(sm, aas, cw)


def test_realtime_autoscaling_parameters() -> None:
    sm, aas, cw, calls = clients()
    desc = endpoint.deploy(
        sm, deployment(scaling=Scaling(1, 4, target_invocations=79)), autoscaling=aas, cloudwatch=cw
    )
    assert calls.names()[:4] == [
        "DescribeEndpoint",
        "CreateModel",
        "CreateEndpointConfig",
        "CreateEndpoint",
    ]  # a new endpoint: nothing of autoscaling to remove first
    # Registered only once the endpoint is in service.
    assert calls.names()[-3:] == ["DescribeEndpoint", "RegisterScalableTarget", "PutScalingPolicy"]
    assert calls.params("RegisterScalableTarget") == {**TARGET, "MinCapacity": 1, "MaxCapacity": 4}
    assert calls.params("PutScalingPolicy") == {
        "PolicyName": "semif-target-tracking",
        **TARGET,
        "PolicyType": "TargetTrackingScaling",
        "TargetTrackingScalingPolicyConfiguration": {
            "TargetValue": 79.0,
            "PredefinedMetricSpecification": {
                "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
            },
            "ScaleInCooldown": 300,
            "ScaleOutCooldown": 60,
        },
    }
    [variant] = calls.params("CreateEndpointConfig")["ProductionVariants"]
    assert variant["InitialInstanceCount"] == 1
    assert "AsyncInferenceConfig" not in calls.params("CreateEndpointConfig")
    [target] = aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["ResourceId"], target["MinCapacity"], target["MaxCapacity"]) == (RESOURCE, 1, 4)
    assert desc["Autoscaling"] == ["1-4 instances", "target 79 invocations per instance per minute"]


def test_min_instances_is_the_initial_count_and_cooldowns_are_sent() -> None:
    sm, aas, cw, calls = clients()
    s = Scaling(2, 6, target_invocations=30, scale_in_cooldown=900, scale_out_cooldown=120)
    endpoint.deploy(sm, deployment(scaling=s), autoscaling=aas, cloudwatch=cw)
    [variant] = calls.params("CreateEndpointConfig")["ProductionVariants"]
    assert variant["InitialInstanceCount"] == 2
    config = calls.params("PutScalingPolicy")["TargetTrackingScalingPolicyConfiguration"]
    assert (config["ScaleInCooldown"], config["ScaleOutCooldown"]) == (900, 120)


def test_fixed_size_needs_no_policy() -> None:
    sm, aas, cw, calls = clients()
    endpoint.deploy(sm, deployment(scaling=Scaling(3, 3)), autoscaling=aas, cloudwatch=cw)
    assert calls.params("RegisterScalableTarget")["MinCapacity"] == 3
    assert "PutScalingPolicy" not in calls.names()


def test_async_endpoint_config() -> None:
    sm, _, _, calls = clients()
    out = AsyncOutput("s3://results/async-out/", "s3://results/async-fail/", 4)
    config_name = endpoint.deploy(sm, deployment(async_output=out))["EndpointConfigName"]
    assert calls.params("CreateEndpointConfig")["AsyncInferenceConfig"] == {
        "OutputConfig": {
            "S3OutputPath": "s3://results/async-out/",
            "S3FailurePath": "s3://results/async-fail/",
        },
        "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 4},
    }
    stored = sm.describe_endpoint_config(EndpointConfigName=config_name)["AsyncInferenceConfig"]
    assert stored["OutputConfig"]["S3OutputPath"] == "s3://results/async-out/"


def test_async_config_leaves_out_what_is_not_given() -> None:
    sm, _, _, calls = clients()
    endpoint.deploy(sm, deployment(async_output=AsyncOutput("s3://results/out/")))
    assert calls.params("CreateEndpointConfig")["AsyncInferenceConfig"] == {
        "OutputConfig": {"S3OutputPath": "s3://results/out/"}
    }


def test_async_scale_to_zero() -> None:
    """AWS's recipe: target tracking on ApproximateBacklogSizePerInstance, plus a step policy
    that a HasBacklogWithoutCapacity alarm fires to leave zero instances."""
    sm, aas, cw, calls = clients()
    d = deployment(
        async_output=AsyncOutput("s3://results/out/"), scaling=Scaling(0, 2, target_backlog=5)
    )
    desc = endpoint.deploy(sm, d, autoscaling=aas, cloudwatch=cw)
    assert calls.names()[-5:] == [
        "DescribeEndpoint",
        "RegisterScalableTarget",
        "PutScalingPolicy",
        "PutScalingPolicy",
        "PutMetricAlarm",
    ]
    # An async endpoint that may scale to zero still starts with one instance.
    [variant] = calls.params("CreateEndpointConfig")["ProductionVariants"]
    assert variant["InitialInstanceCount"] == 1
    assert calls.params("RegisterScalableTarget") == {**TARGET, "MinCapacity": 0, "MaxCapacity": 2}
    tracking, step = [p for n, p in calls.made if n == "PutScalingPolicy"]
    assert tracking == {
        "PolicyName": "semif-target-tracking",
        **TARGET,
        "PolicyType": "TargetTrackingScaling",
        "TargetTrackingScalingPolicyConfiguration": {
            "TargetValue": 5.0,
            "CustomizedMetricSpecification": {
                "MetricName": "ApproximateBacklogSizePerInstance",
                "Namespace": "AWS/SageMaker",
                "Dimensions": [{"Name": "EndpointName", "Value": "semif-ep"}],
                "Statistic": "Average",
            },
            "ScaleInCooldown": 300,
            "ScaleOutCooldown": 60,
        },
    }
    assert step == {
        "PolicyName": "semif-scale-from-zero",
        **TARGET,
        "PolicyType": "StepScaling",
        "StepScalingPolicyConfiguration": {
            "AdjustmentType": "ChangeInCapacity",
            "MetricAggregationType": "Average",
            "Cooldown": 300,
            "StepAdjustments": [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}],
        },
    }
    policies = aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    step_arn = next(p["PolicyARN"] for p in policies if p["PolicyName"] == "semif-scale-from-zero")
    assert calls.params("PutMetricAlarm") == {
        "AlarmName": "semif-ep-semif-scale-from-zero",
        "MetricName": "HasBacklogWithoutCapacity",
        "Namespace": "AWS/SageMaker",
        "Statistic": "Average",
        "Dimensions": [{"Name": "EndpointName", "Value": "semif-ep"}],
        "Period": 60,
        "EvaluationPeriods": 2,
        "DatapointsToAlarm": 2,
        "Threshold": 1.0,
        "ComparisonOperator": "GreaterThanOrEqualToThreshold",
        "TreatMissingData": "missing",
        "AlarmActions": [step_arn],
    }
    assert desc["Autoscaling"][-1] == "scale from zero on alarm 'semif-ep-semif-scale-from-zero'"

    # delete takes all of it away again.
    assert endpoint.delete(sm, "semif-ep", aas, cw) == [
        "endpoint semif-ep",
        f"endpoint config {desc['EndpointConfigName']}",
        f"model {desc['ModelName']}",
        "scalable target",
        "alarm",
    ]
    assert aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert cw.describe_alarms()["MetricAlarms"] == []


def test_async_min_one_has_no_scale_from_zero_policy() -> None:
    sm, aas, cw, calls = clients()
    d = deployment(
        async_output=AsyncOutput("s3://results/out/"), scaling=Scaling(1, 3, target_backlog=2)
    )
    endpoint.deploy(sm, d, autoscaling=aas, cloudwatch=cw)
    assert calls.names().count("PutScalingPolicy") == 1
    assert "PutMetricAlarm" not in calls.names()


ASYNC = AsyncOutput("s3://results/out/")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"scaling": Scaling(0, 2, 10)}, "--min-instances must be at least 1.*only --async"),
        ({"scaling": Scaling(3, 2, 10)}, r"--max-instances \(2\) must be at least 1 and at least"),
        (
            {"scaling": Scaling(1, 4)},
            "above --min-instances 1 needs --target-invocations",
        ),
        ({"scaling": Scaling(1, 4, 0)}, "--target-invocations must be greater than 0"),
        ({"scaling": Scaling(1, 4, -5)}, "--target-invocations must be greater than 0"),
        ({"scaling": Scaling(1, 4, 5, scale_in_cooldown=-1)}, "--scale-in-cooldown must be"),
        ({"scaling": Scaling(1, 4, target_backlog=5)}, "--target-backlog is for --async"),
        (
            {"scaling": Scaling(0, 4, target_invocations=5), "async_output": ASYNC},
            "--target-invocations is for real-time endpoints",
        ),
        ({"scaling": Scaling(0, 4), "async_output": ASYNC}, "needs --target-backlog"),
        ({"scaling": Scaling(-1, 4, target_backlog=1), "async_output": ASYNC}, "at least 0"),
        ({"scaling": Scaling(0, 0), "async_output": ASYNC}, "--max-instances .0. must be at least"),
        ({"async_output": AsyncOutput("results/out/")}, "--output: not an S3 URI"),
        ({"async_output": AsyncOutput("s3://r/o/", "/tmp/f")}, "--failure-output: not an S3 URI"),
        ({"async_output": AsyncOutput("s3://r/o/", None, 0)}, "--max-concurrent-invocations"),
        ({"name": "semif_ep"}, "--name must be 1-63 letters, digits and hyphens"),
    ],
)
def test_bad_parameters_are_refused_before_any_call(changes: dict, message: str) -> None:
    sm, aas, cw, calls = clients()
    with pytest.raises(DeployError, match=message):
        endpoint.deploy(sm, deployment(**changes), autoscaling=aas, cloudwatch=cw)
    assert calls.made == []


def test_scaling_check_alone() -> None:
    """The edges of what the check accepts: each accepted setting next to the one step past
    it that it refuses (scaling to zero is for async endpoints only; a fixed count needs no
    target; a range needs one)."""
    assert scaling.check(Scaling(0, 1, target_backlog=1), asynchronous=True) is None
    with pytest.raises(DeployError, match="only --async endpoints scale to zero"):
        scaling.check(Scaling(0, 1, target_invocations=1), asynchronous=False)
    assert scaling.check(Scaling(2, 2), asynchronous=False) is None
    with pytest.raises(DeployError, match="needs --target-invocations"):
        scaling.check(Scaling(2, 3), asynchronous=False)
    assert scaling.check(Scaling(1, 3, target_invocations=0.5), asynchronous=False) is None
    with pytest.raises(DeployError, match="must be greater than 0"):
        scaling.check(Scaling(1, 3, target_invocations=0), asynchronous=False)


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_client(*_: object) -> None:
        raise AssertionError("refused flags must not reach AWS")

    monkeypatch.setattr("semif_proxy.deploy.actions._client", no_client)


DEPLOY = ["deploy", "--image", deployment().image, "--model-data", "s3://m/model.tar.gz"]
DEPLOY += ["--role", ROLE, "--instance-type", "ml.c5.xlarge", "--name", "semif-ep"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-instances", "3"], "needs --target-invocations"),
        (["--target-invocations", "60"], "autoscaling needs --max-instances"),
        (["--scale-in-cooldown", "60"], "need --max-instances"),
        (["--output", "s3://r/o/"], "--output is for asynchronous endpoints: add --async"),
        (["--max-concurrent-invocations", "2"], "add --async"),
        (["--async"], "--async needs --output"),
        (["--min-instances", "0", "--max-instances", "2", "--target-invocations", "5"], "only"),
    ],
)
def test_deploy_command_refuses_flags(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str], no_aws: None
) -> None:
    assert main([*DEPLOY, *flags]) == 2  # a usage error: refused before any AWS call
    assert message in capsys.readouterr().err


def test_deploy_command_async_scale_to_zero(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--async", "--output", "s3://r/out/", "--failure-output", "s3://r/fail/"]
    flags += ["--min-instances", "0", "--max-instances", "2", "--target-backlog", "5"]
    assert main([*DEPLOY, *flags]) == 0
    out = capsys.readouterr().out.splitlines()
    version = out[1].rpartition(" model ")[2]
    assert out == [
        "semif-ep InService",
        f"endpoint config {version}, model {version}",
        "autoscaling: 0-2 instances, target 5 backlog per instance, "
        "scale from zero on alarm 'semif-ep-semif-scale-from-zero'",
    ]
    aas = boto3.client("application-autoscaling", region_name=REGION)
    [target] = aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["MinCapacity"], target["MaxCapacity"]) == (0, 2)
    assert main(["delete", "--endpoint", "semif-ep"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"deleted endpoint semif-ep, endpoint config {version}, model {version}, "
        "scalable target, alarm"
    )
