"""`semif-proxy batch`: a Batch Transform job over JSON Lines in S3 (one request per line, one
line per call unless --multi-record), creating the SageMaker model first if it does not exist."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from semif_proxy import progress
from semif_proxy.deploy import instances, model, names, s3uri
from semif_proxy.deploy.errors import DeployError, UsageError, aws_errors, poll

MAX_PAYLOAD_MB = 100  # SageMaker's limit, also for MaxConcurrentTransforms x MaxPayloadInMB
JSON_LINES = "application/jsonlines"
# CreateTransformJob refuses a model whose container uses ModelDataSource.
UNCOMPRESSED = (
    "Batch Transform does not take uncompressed model data (ModelDataSource): package the "
    "model as model.tar.gz (package-model without --uncompressed) for batch"
)


@dataclass(frozen=True)
class Transform:
    model_name: str
    input: str  # s3://bucket/prefix/ of .jsonl objects
    output: str  # s3://bucket/prefix/ for <object>.out
    instance_type: str = "ml.c6i.xlarge"
    instance_count: int = 1
    max_payload_mb: int = 6
    max_concurrent: int = 0  # 0: SageMaker asks GET /execution-parameters
    # Many lines per call: only for inputs whose calls the user has sized to finish within the
    # container's request deadline (a line the deadline misses fails the call, which SageMaker
    # retries and then fails the job); one line per call always fits.
    multi_record: bool = False


def check(t: Transform) -> None:
    names.check(t.model_name, "--model-name")
    s3uri.parse(t.input, "--input")
    s3uri.parse(t.output, "--output")
    if instances.is_gpu(t.instance_type):
        # TransformResources.TransformAmiVersion offers NVIDIA drivers 470 and 535 only.
        raise UsageError(
            f"--instance-type {t.instance_type}: Batch Transform GPU hosts run NVIDIA driver "
            "535 at most and the GPU image needs 580 (CUDA 13); batch on a CPU instance, or "
            "deploy --async --gpu"
        )
    instances.check(t.instance_type, gpu=False)
    if t.instance_count < 1:
        raise DeployError(f"--instance-count must be at least 1, got {t.instance_count}")
    if not 1 <= t.max_payload_mb <= MAX_PAYLOAD_MB:
        raise DeployError(f"--max-payload-mb must be 1-{MAX_PAYLOAD_MB}, got {t.max_payload_mb}")
    if t.max_concurrent < 0:
        raise DeployError(f"--max-concurrent-transforms must be 0 or more, got {t.max_concurrent}")
    if t.max_concurrent * t.max_payload_mb > MAX_PAYLOAD_MB:
        raise DeployError(
            f"--max-concurrent-transforms x --max-payload-mb must be at most {MAX_PAYLOAD_MB} MB, "
            f"got {t.max_concurrent} x {t.max_payload_mb}"
        )


def job_request(t: Transform, job: str) -> dict[str, Any]:
    request: dict[str, Any] = {
        "TransformJobName": job,
        "ModelName": t.model_name,
        "BatchStrategy": "MultiRecord" if t.multi_record else "SingleRecord",
        "MaxPayloadInMB": t.max_payload_mb,
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": t.input}},
            "ContentType": JSON_LINES,
            "SplitType": "Line",
            "CompressionType": "None",
        },
        "TransformOutput": {
            "S3OutputPath": t.output,
            "AssembleWith": "Line",
            "Accept": JSON_LINES,
        },
        "TransformResources": {
            "InstanceType": t.instance_type,
            "InstanceCount": t.instance_count,
        },
    }
    if t.max_concurrent:
        request["MaxConcurrentTransforms"] = t.max_concurrent
    return request


def wait_job(
    sagemaker: Any,
    job: str,
    timeout: float = 86400,
    interval: float = 30,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    status_line = progress.Status(f"transform job {job}")

    def step() -> tuple[bool, Any]:
        with aws_errors(f"describe transform job {job!r}"):
            desc = sagemaker.describe_transform_job(TransformJobName=job)
        status = desc["TransformJobStatus"]
        status_line.update(status)
        if status in ("Failed", "Stopped", "Stopping"):
            reason = desc.get("FailureReason") or "no reason given"
            raise DeployError(
                f"transform job {job!r} is {status}: {reason} (logs: CloudWatch "
                f"/aws/sagemaker/TransformJobs, streams {job}/...)"
            )
        return status == "Completed", desc if status == "Completed" else status

    return poll(step, f"transform job {job!r}", timeout, interval, sleep)


def run(
    sagemaker: Any,
    t: Transform,
    create_with: model.Model | None = None,
    wait: Callable[[Any, str], dict[str, Any]] | None = wait_job,
    now: datetime | None = None,
) -> tuple[str, str]:
    """Start the job (creating the model first if it is missing); (job name, status)."""
    check(t)
    if create_with is not None:
        if create_with.name != t.model_name:
            raise DeployError("the model to create must be named --model-name")
        model.check(create_with, "--model-name")
        if model.uncompressed(create_with.model_data):
            raise UsageError(UNCOMPRESSED)
    found = model.describe(sagemaker, t.model_name)
    if found is not None and "ModelDataSource" in found.get("PrimaryContainer", {}):
        raise DeployError(f"SageMaker model {t.model_name!r}: {UNCOMPRESSED}")
    if found is None:
        if create_with is None:
            raise DeployError(
                f"SageMaker model {t.model_name!r} does not exist: give --image, --model-data "
                "and --role to create it"
            )
        model.create(sagemaker, create_with)
    job = names.job_name(t.model_name, now)
    with aws_errors(f"create transform job {job!r}"):
        sagemaker.create_transform_job(**job_request(t, job))
    progress.note(
        f"transform job {job}: started on model {t.model_name} (logs: CloudWatch "
        f"/aws/sagemaker/TransformJobs, streams {job}/...)"
    )
    if wait is None:
        return job, "InProgress"
    return job, wait(sagemaker, job)["TransformJobStatus"]
