"""Application Auto Scaling for an endpoint's variant: target tracking on invocations per
instance (real-time), or on the backlog per instance (async, which may scale to zero and then
needs a step policy on HasBacklogWithoutCapacity to scale out again, as AWS documents)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from semif_proxy.deploy.errors import DeployError, aws_errors
from semif_proxy.deploy.names import VARIANT

NAMESPACE = "sagemaker"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"
TRACKING_POLICY = "semif-target-tracking"
FROM_ZERO_POLICY = "semif-scale-from-zero"
FROM_ZERO_COOLDOWN_S = 300  # AWS's example; an instance takes minutes to start anyway


@dataclass(frozen=True)
class Scaling:
    min_instances: int = 1
    max_instances: int = 1
    # Real-time: SageMakerVariantInvocationsPerInstance, requests per instance per MINUTE.
    target_invocations: float | None = None
    # Async: ApproximateBacklogSizePerInstance, queued requests per instance.
    target_backlog: float | None = None
    scale_in_cooldown: int = 300
    scale_out_cooldown: int = 60


def resource_id(endpoint: str) -> str:
    return f"endpoint/{endpoint}/variant/{VARIANT}"


def alarm_name(endpoint: str) -> str:
    return f"{endpoint}-{FROM_ZERO_POLICY}"


def target(s: Scaling, asynchronous: bool) -> float | None:
    return s.target_backlog if asynchronous else s.target_invocations


def check(s: Scaling, asynchronous: bool) -> None:
    flag = "--target-backlog" if asynchronous else "--target-invocations"
    if asynchronous and s.target_invocations is not None:
        raise DeployError(
            "--target-invocations is for real-time endpoints; an --async endpoint scales on "
            "--target-backlog (queued requests per instance)"
        )
    if not asynchronous and s.target_backlog is not None:
        raise DeployError(
            "--target-backlog is for --async endpoints; a real-time endpoint scales on "
            "--target-invocations (requests per instance per minute)"
        )
    if s.min_instances < (0 if asynchronous else 1):
        raise DeployError(
            f"--min-instances must be at least 1, got {s.min_instances} (only --async "
            "endpoints scale to zero)"
            if not asynchronous
            else f"--min-instances must be at least 0, got {s.min_instances}"
        )
    if s.max_instances < max(1, s.min_instances):
        raise DeployError(
            f"--max-instances ({s.max_instances}) must be at least 1 and at least "
            f"--min-instances ({s.min_instances})"
        )
    value = target(s, asynchronous)
    if value is not None and not value > 0:
        raise DeployError(f"{flag} must be greater than 0, got {value}")
    if value is None and s.max_instances > s.min_instances:
        raise DeployError(
            f"--max-instances {s.max_instances} above --min-instances {s.min_instances} needs "
            f"{flag} (the value the instance count tracks)"
        )
    for name, cooldown in (
        ("--scale-in-cooldown", s.scale_in_cooldown),
        ("--scale-out-cooldown", s.scale_out_cooldown),
    ):
        if cooldown < 0:
            raise DeployError(f"{name} must be 0 or more seconds, got {cooldown}")


def tracking_config(endpoint: str, s: Scaling, asynchronous: bool) -> dict[str, Any]:
    if asynchronous:
        metric: dict[str, Any] = {
            "CustomizedMetricSpecification": {
                "MetricName": "ApproximateBacklogSizePerInstance",
                "Namespace": "AWS/SageMaker",
                "Dimensions": [{"Name": "EndpointName", "Value": endpoint}],
                "Statistic": "Average",
            }
        }
    else:
        metric = {
            "PredefinedMetricSpecification": {
                "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
            }
        }
    return {
        "TargetValue": float(target(s, asynchronous) or 0),
        **metric,
        "ScaleInCooldown": s.scale_in_cooldown,
        "ScaleOutCooldown": s.scale_out_cooldown,
    }


def _target_args(endpoint: str) -> dict[str, str]:
    return {
        "ServiceNamespace": NAMESPACE,
        "ResourceId": resource_id(endpoint),
        "ScalableDimension": DIMENSION,
    }


def apply(
    autoscaling: Any, cloudwatch: Any, endpoint: str, s: Scaling, asynchronous: bool
) -> list[str]:
    """Register the variant, then its policies (the endpoint must be InService)."""
    done = []
    with aws_errors(f"register {resource_id(endpoint)} with Application Auto Scaling"):
        autoscaling.register_scalable_target(
            **_target_args(endpoint), MinCapacity=s.min_instances, MaxCapacity=s.max_instances
        )
    done.append(f"{s.min_instances}-{s.max_instances} instances")
    if target(s, asynchronous) is not None:
        with aws_errors(f"put scaling policy {TRACKING_POLICY!r}"):
            autoscaling.put_scaling_policy(
                PolicyName=TRACKING_POLICY,
                **_target_args(endpoint),
                PolicyType="TargetTrackingScaling",
                TargetTrackingScalingPolicyConfiguration=tracking_config(endpoint, s, asynchronous),
            )
        metric = "backlog per instance" if asynchronous else "invocations per instance per minute"
        done.append(f"target {target(s, asynchronous):g} {metric}")
    if asynchronous and s.min_instances == 0:
        scale_from_zero(autoscaling, cloudwatch, endpoint)
        done.append(f"scale from zero on alarm {alarm_name(endpoint)!r}")
    return done


def scale_from_zero(autoscaling: Any, cloudwatch: Any, endpoint: str) -> None:
    """Target tracking cannot leave zero instances (no instance, no per-instance backlog): a
    step policy adds one instance when HasBacklogWithoutCapacity alarms."""
    with aws_errors(f"put scaling policy {FROM_ZERO_POLICY!r}"):
        arn = autoscaling.put_scaling_policy(
            PolicyName=FROM_ZERO_POLICY,
            **_target_args(endpoint),
            PolicyType="StepScaling",
            StepScalingPolicyConfiguration={
                "AdjustmentType": "ChangeInCapacity",
                "MetricAggregationType": "Average",
                "Cooldown": FROM_ZERO_COOLDOWN_S,
                "StepAdjustments": [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}],
            },
        )["PolicyARN"]
    with aws_errors(f"create CloudWatch alarm {alarm_name(endpoint)!r}"):
        cloudwatch.put_metric_alarm(
            AlarmName=alarm_name(endpoint),
            MetricName="HasBacklogWithoutCapacity",
            Namespace="AWS/SageMaker",
            Statistic="Average",
            Dimensions=[{"Name": "EndpointName", "Value": endpoint}],
            Period=60,
            EvaluationPeriods=2,
            DatapointsToAlarm=2,
            Threshold=1.0,
            ComparisonOperator="GreaterThanOrEqualToThreshold",
            TreatMissingData="missing",
            AlarmActions=[arn],
        )


def remove(autoscaling: Any, cloudwatch: Any, endpoint: str) -> list[str]:
    """Deregister the variant (which drops its policies) and delete the scale-from-zero alarm;
    each one that exists."""
    removed = []
    with aws_errors(f"look up {resource_id(endpoint)} in Application Auto Scaling"):
        found = autoscaling.describe_scalable_targets(
            ServiceNamespace=NAMESPACE,
            ResourceIds=[resource_id(endpoint)],
            ScalableDimension=DIMENSION,
        )["ScalableTargets"]
    if found:
        with aws_errors(f"deregister {resource_id(endpoint)}"):
            autoscaling.deregister_scalable_target(**_target_args(endpoint))
        removed.append("scalable target")
    with aws_errors(f"look up CloudWatch alarm {alarm_name(endpoint)!r}"):
        alarms = cloudwatch.describe_alarms(AlarmNames=[alarm_name(endpoint)])["MetricAlarms"]
    if alarms:
        with aws_errors(f"delete CloudWatch alarm {alarm_name(endpoint)!r}"):
            cloudwatch.delete_alarms(AlarmNames=[alarm_name(endpoint)])
        removed.append("alarm")
    return removed
