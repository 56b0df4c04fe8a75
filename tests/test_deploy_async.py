"""`invoke --async` against moto (S3, SageMaker runtime): the body goes to S3, InvokeEndpointAsync
gets its location, and the result or failure object is polled until it appears."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
import requests

from semif_proxy.cli import main
from semif_proxy.deploy import async_invoke
from semif_proxy.deploy.errors import DeployError
from tests.test_deploy import REGION, Calls, aws  # noqa: F401 (aws: autouse)

BODY = b'{"decision": {"question": "Which team?", "options": ["billing", "shipping"]}}'


def moto_async_results(*results: dict) -> None:
    """Queue what moto's InvokeEndpointAsync writes next (its own API, served under mock_aws)."""
    requests.post(
        "http://motoapi.amazonaws.com/moto-api/static/sagemaker/async-endpoint-results",
        json={"region": REGION, "results": list(results)},
        timeout=10,
    ).raise_for_status()


def test_invoke_async_uploads_invokes_and_reads_the_result() -> None:
    s3 = boto3.client("s3", region_name=REGION)
    runtime = boto3.client("sagemaker-runtime", region_name=REGION)
    s3.create_bucket(Bucket="requests")
    moto_async_results({"data": json.dumps({"decisions": [{"choice": "billing"}]})})
    calls = Calls(s3, runtime)

    output, body = async_invoke.invoke_async(
        s3, runtime, "semif-ep", BODY, "s3://requests/async-in/", timeout=0
    )
    assert json.loads(body) == {"decisions": [{"choice": "billing"}]}
    put = calls.params("PutObject")
    assert put["Bucket"] == "requests" and put["Key"].startswith("async-in/")
    assert put["Key"].endswith(".json") and put["ContentType"] == "application/json"
    assert put["Body"] == BODY
    assert calls.params("InvokeEndpointAsync") == {
        "EndpointName": "semif-ep",
        "InputLocation": f"s3://requests/{put['Key']}",
        "ContentType": "application/json",
    }
    uploaded = s3.get_object(Bucket="requests", Key=put["Key"])["Body"].read()
    assert uploaded == BODY
    # The result came from the OutputLocation moto returned.
    bucket, _, key = output.removeprefix("s3://").partition("/")
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body


def test_invoke_async_reports_the_failure_object() -> None:
    s3 = boto3.client("s3", region_name=REGION)
    runtime = boto3.client("sagemaker-runtime", region_name=REGION)
    s3.create_bucket(Bucket="requests")
    moto_async_results({"is_failure": True, "data": "model container exited with code 1"})
    with pytest.raises(DeployError, match=r"request failed .*failure\.json.*exited with code"):
        async_invoke.invoke_async(s3, runtime, "semif-ep", BODY, "s3://requests/in/", timeout=0)


def test_wait_result_polls_until_the_object_appears() -> None:
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="results")
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:  # SageMaker finishes while we wait
            s3.put_object(Bucket="results", Key="out/abc.out", Body=b'{"ok": true}')

    body = async_invoke.wait_result(
        s3, "s3://results/out/abc.out", "s3://results/fail/abc.out", 60, 2, sleep
    )
    assert body == b'{"ok": true}' and sleeps == [2, 2, 2]


def test_wait_result_gives_up_after_the_timeout() -> None:
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="results")
    with pytest.raises(DeployError, match=r"still absent after 0s .*raise --timeout"):
        async_invoke.wait_result(s3, "s3://results/out/x.out", None, 0, 0, lambda _: None)


def test_wait_result_reports_other_s3_errors() -> None:
    s3 = boto3.client("s3", region_name=REGION)
    with pytest.raises(DeployError, match=r"could not read s3://missing-bucket/x.*NoSuchBucket"):
        async_invoke.wait_result(s3, "s3://missing-bucket/x", None, 0, 0, lambda _: None)


def test_bad_input_location_is_refused_before_any_call() -> None:
    s3 = boto3.client("s3", region_name=REGION)
    runtime = boto3.client("sagemaker-runtime", region_name=REGION)
    calls = Calls(s3, runtime)
    with pytest.raises(DeployError, match="--input-location: not an S3 URI"):
        async_invoke.invoke_async(s3, runtime, "semif-ep", BODY, "requests/in/", timeout=0)
    with pytest.raises(DeployError, match="--timeout must be 0 or more"):
        async_invoke.invoke_async(s3, runtime, "semif-ep", BODY, "s3://r/in/", timeout=-1)
    assert calls.made == []


def test_invoke_async_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    boto3.client("s3", region_name=REGION).create_bucket(Bucket="requests")
    moto_async_results({"data": '{"choice": "billing"}'})
    request = tmp_path / "request.json"
    request.write_bytes(BODY)
    args = ["invoke", "--endpoint", "semif-ep", "--body", str(request)]
    assert main([*args, "--async", "--input-location", "s3://requests/in/"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"choice": "billing"}
    assert captured.out.startswith("{\n  ")  # pretty-printed
    assert "result: s3://" in captured.err


def test_invoke_command_refuses_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_client(*_: object) -> None:
        raise AssertionError("refused flags must not reach AWS")

    monkeypatch.setattr("semif_proxy.deploy.actions._client", no_client)
    request = tmp_path / "request.json"
    request.write_bytes(BODY)
    args = ["invoke", "--endpoint", "semif-ep", "--body", str(request)]
    # Usage errors, refused before any AWS call: exit 2.
    assert main([*args, "--async"]) == 2
    assert "--async needs --input-location" in capsys.readouterr().err
    assert main([*args, "--input-location", "s3://r/in/"]) == 2
    assert "--input-location is for --async" in capsys.readouterr().err
    assert main(["invoke", "--endpoint", "e", "--body", str(tmp_path / "none.json")]) == 2
    assert "--body: cannot read" in capsys.readouterr().err
