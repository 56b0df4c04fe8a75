"""The AsyncInferenceConfig of an `--async` endpoint: where results and failures go, and how
many requests SageMaker hands each instance at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from semif_proxy.deploy import s3uri
from semif_proxy.deploy.errors import DeployError

MAX_CONCURRENT = 1000  # AsyncInferenceClientConfig.MaxConcurrentInvocationsPerInstance


@dataclass(frozen=True)
class AsyncOutput:
    output: str  # s3://bucket/prefix/ for results
    failure: str | None = None  # s3://bucket/prefix/ for errors
    max_concurrent: int | None = None  # per instance; SageMaker chooses when unset


def check(a: AsyncOutput) -> None:
    s3uri.parse(a.output, "--output")
    if a.failure is not None:
        s3uri.parse(a.failure, "--failure-output")
    if a.max_concurrent is not None and not 1 <= a.max_concurrent <= MAX_CONCURRENT:
        raise DeployError(
            f"--max-concurrent-invocations must be 1-{MAX_CONCURRENT}, got {a.max_concurrent}"
        )


def config(a: AsyncOutput) -> dict[str, Any]:
    output = {"S3OutputPath": a.output}
    if a.failure is not None:
        output["S3FailurePath"] = a.failure
    out: dict[str, Any] = {"OutputConfig": output}
    if a.max_concurrent is not None:
        out["ClientConfig"] = {"MaxConcurrentInvocationsPerInstance": a.max_concurrent}
    return out
