"""`semif-proxy batch` against moto (SageMaker): the model deploy creates (created only when
missing), the transform job's exact parameters, its name, and failures. moto's transform jobs
are Completed as soon as they are created; the failed job is a botocore Stubber answer."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import boto3
import pytest
from botocore.stub import Stubber

from semif_proxy.cli import main
from semif_proxy.deploy import batch, endpoint, names
from semif_proxy.deploy.errors import DeployError
from tests.test_deploy import REGION, ROLE, Calls, aws, deployment  # noqa: F401 (aws: autouse)

NOW = datetime(2026, 3, 1, 12, 30, 45, 123456, tzinfo=timezone.utc)


def transform(**changes: object) -> batch.Transform:
    base = {
        "model_name": "semif-ep",
        "input": "s3://data/in/",
        "output": "s3://data/out/",
        "instance_type": "ml.c5.xlarge",
    }
    return batch.Transform(**{**base, **changes})  # type: ignore[arg-type]


def no_sleep_wait(sm: object, job: str) -> dict:
    return batch.wait_job(sm, job, interval=0, sleep=lambda _: None)


def test_batch_creates_the_model_then_the_job() -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    calls = Calls(sm)
    d = deployment()
    job, status = batch.run(sm, transform(), d.as_model(), wait=no_sleep_wait, now=NOW)
    assert (job, status) == ("semif-ep-20260301-123045-123", "Completed")
    assert calls.names() == [
        "DescribeModel",
        "CreateModel",
        "CreateTransformJob",
        "DescribeTransformJob",
    ]
    assert calls.params("CreateTransformJob") == {
        "TransformJobName": job,
        "ModelName": "semif-ep",
        "BatchStrategy": "SingleRecord",  # one line per call: each fits the request deadline
        "MaxPayloadInMB": 6,
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/in/"}},
            "ContentType": "application/jsonlines",
            "SplitType": "Line",
            "CompressionType": "None",
        },
        "TransformOutput": {
            "S3OutputPath": "s3://data/out/",
            "AssembleWith": "Line",
            "Accept": "application/jsonlines",
        },
        "TransformResources": {"InstanceType": "ml.c5.xlarge", "InstanceCount": 1},
    }  # no MaxConcurrentTransforms: SageMaker asks GET /execution-parameters
    # The model is the one `deploy` creates, network isolation on.
    created = calls.params("CreateModel")
    sm2 = boto3.client("sagemaker", region_name="us-west-2")
    deploy_calls = Calls(sm2)
    endpoint.deploy(sm2, d)
    deployed = deploy_calls.params("CreateModel")
    assert deployed["ModelName"].startswith("semif-ep-")  # deploy stamps its model's name
    assert {**created, "ModelName": ""} == {**deployed, "ModelName": ""}
    assert created["EnableNetworkIsolation"] is True
    stored = sm.describe_transform_job(TransformJobName=job)
    assert stored["TransformInput"]["ContentType"] == "application/jsonlines"


def test_batch_reuses_an_existing_model() -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    deployed = endpoint.deploy(sm, deployment())["ModelName"]
    calls = Calls(sm)
    t = transform(
        model_name=deployed,
        max_concurrent=4,
        max_payload_mb=25,
        instance_count=2,
        multi_record=True,
    )
    _, status = batch.run(sm, t, None, wait=None, now=NOW)
    assert status == "InProgress"
    assert calls.names() == ["DescribeModel", "CreateTransformJob"]
    request = calls.params("CreateTransformJob")
    assert request["MaxConcurrentTransforms"] == 4 and request["MaxPayloadInMB"] == 25
    assert request["BatchStrategy"] == "MultiRecord"
    assert request["TransformResources"]["InstanceCount"] == 2


def test_batch_without_a_model_or_the_flags_to_create_it() -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    calls = Calls(sm)
    with pytest.raises(DeployError, match="does not exist: give --image, --model-data and --role"):
        batch.run(sm, transform(), None, wait=None)
    assert calls.names() == ["DescribeModel"]


def test_failed_job_reports_its_reason() -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    described = {
        "TransformJobName": "j",
        "TransformJobArn": "arn:aws:sagemaker:us-east-1:1:transform-job/j",
        "ModelName": "semif-ep",
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://d/in/"}}
        },
        "TransformResources": {"InstanceType": "ml.c5.xlarge", "InstanceCount": 1},
        "CreationTime": "2026-01-01T00:00:00Z",
    }
    with Stubber(sm) as stub:  # moto's jobs complete at once; it cannot make one fail
        stub.add_response(
            "describe_transform_job",
            {**described, "TransformJobStatus": "InProgress"},
            {"TransformJobName": "j"},
        )
        stub.add_response(
            "describe_transform_job",
            {
                **described,
                "TransformJobStatus": "Failed",
                "FailureReason": "ClientError: See job logs for more information",
            },
            {"TransformJobName": "j"},
        )
        with pytest.raises(DeployError, match="'j' is Failed: ClientError: See job logs"):
            batch.wait_job(sm, "j", sleep=lambda _: None)
        stub.assert_no_pending_responses()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"input": "data/in/"}, "--input: not an S3 URI"),
        ({"output": "/tmp/out"}, "--output: not an S3 URI"),
        ({"model_name": "semif_ep"}, "--model-name must be 1-63"),
        ({"instance_type": "ml.g5.xlarge"}, "driver 535 at most"),
        ({"instance_type": "ml.inf2.xlarge"}, "Inferentia"),
        ({"instance_count": 0}, "--instance-count must be at least 1"),
        ({"max_payload_mb": 0}, "--max-payload-mb must be 1-100"),
        ({"max_payload_mb": 101}, "--max-payload-mb must be 1-100"),
        ({"max_concurrent": -1}, "--max-concurrent-transforms must be 0 or more"),
        ({"max_concurrent": 20, "max_payload_mb": 6}, "at most 100 MB, got 20 x 6"),
    ],
)
def test_bad_parameters_are_refused_before_any_call(changes: dict, message: str) -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    calls = Calls(sm)
    with pytest.raises(DeployError, match=message):
        batch.run(sm, transform(**changes), deployment().as_model(), wait=None)
    with pytest.raises(DeployError, match="--image must be pinned"):
        batch.run(sm, transform(), deployment(image="repo:latest").as_model(), wait=None)
    assert calls.made == []


def test_job_names_are_valid_and_short() -> None:
    pattern = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
    for model in ("semif-ep", "m" * 63, "a-" * 31 + "b", "x"):
        name = names.job_name(model, NOW)
        assert len(name) <= 63 and pattern.fullmatch(name), name
        assert name.endswith("-20260301-123045-123")
    assert names.job_name("m" * 63, NOW) == "m" * 43 + "-20260301-123045-123"


def test_batch_command(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["batch", "--input", "s3://data/in/", "--output", "s3://data/out/"]
    args += ["--model-name", "semif-batch", "--instance-type", "ml.c5.xlarge"]
    create = ["--image", deployment().image, "--model-data", "s3://m/model.tar.gz"]
    assert main([*args, *create, "--role", ROLE]) == 0
    out = capsys.readouterr().out.strip()
    assert re.fullmatch(
        r"semif-batch-\d{8}-\d{6}-\d{3} Completed: results in s3://data/out/ "
        r"\(<input object>\.out for each input\)",
        out,
    )
    sm = boto3.client("sagemaker", region_name=REGION)
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == ["semif-batch"]
    # Second run: the model exists, no --image needed; --no-wait returns at once.
    assert main([*args, "--no-wait", "--multi-record"]) == 0
    assert re.search(r"InProgress: results will be in s3://data/out/", capsys.readouterr().out)
    jobs = sm.list_transform_jobs(SortBy="CreationTime", SortOrder="Ascending")
    strategies = [
        sm.describe_transform_job(TransformJobName=j["TransformJobName"])["BatchStrategy"]
        for j in jobs["TransformJobSummaries"]
    ]
    assert strategies == ["SingleRecord", "MultiRecord"]


def test_batch_command_refuses_half_a_model(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_client(*_: object) -> None:
        raise AssertionError("refused flags must not reach AWS")

    monkeypatch.setattr("semif_proxy.deploy.actions._client", no_client)
    monkeypatch.delenv("SEMIF_SAGEMAKER_ROLE", raising=False)
    args = ["batch", "--input", "s3://d/in/", "--output", "s3://d/out/", "--model-name", "m"]
    assert main([*args, "--image", deployment().image]) == 2
    assert "creating the model needs --model-data too" in capsys.readouterr().err
    assert main([*args, "--image", deployment().image, "--model-data", "s3://m/x.tar.gz"]) == 2
    assert "--role or set SEMIF_SAGEMAKER_ROLE" in capsys.readouterr().err
    # An arm64 host cannot run the amd64 image: one line, exit 2, no client made.
    assert main([*args, "--instance-type", "ml.m7g.xlarge"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("semif-proxy batch: --instance-type ml.m7g.xlarge is AWS Graviton")
