"""`semif-proxy invoke --async`: the request body to S3, InvokeEndpointAsync, then the result
(or failure) object SageMaker writes, polled until one appears."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from semif_proxy.deploy import s3uri
from semif_proxy.deploy.errors import DeployError, aws_errors, poll


def upload_request(s3: Any, body: bytes, input_location: str, key_name: str | None = None) -> str:
    bucket, prefix = s3uri.parse(input_location, "--input-location")
    key = s3uri.join(prefix, key_name or f"{uuid.uuid4().hex}.json")
    with aws_errors(f"upload the request to s3://{bucket}/{key}"):
        s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
    return f"s3://{bucket}/{key}"


def start(runtime: Any, endpoint: str, input_uri: str) -> tuple[str, str | None]:
    with aws_errors(f"invoke endpoint {endpoint!r} asynchronously"):
        reply = runtime.invoke_endpoint_async(
            EndpointName=endpoint, InputLocation=input_uri, ContentType="application/json"
        )
    return reply["OutputLocation"], reply.get("FailureLocation")


def read_if_there(s3: Any, uri: str) -> bytes | None:
    from botocore.exceptions import ClientError

    bucket, key = s3uri.parse(uri)
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        with aws_errors(f"read {uri} (reading a missing object needs s3:ListBucket)"):
            raise


def wait_result(
    s3: Any,
    output: str,
    failure: str | None,
    timeout: float,
    interval: float = 5,
    sleep: Callable[[float], None] = time.sleep,
) -> bytes:
    def step() -> tuple[bool, Any]:
        body = read_if_there(s3, output)
        if body is not None:
            return True, body
        if failure is not None:
            error = read_if_there(s3, failure)
            if error is not None:
                text = error.decode("utf-8", "replace")[:4000]
                raise DeployError(f"the async request failed ({failure}): {text}")
        return False, "absent"

    try:
        return poll(step, f"result {output}", timeout, interval, sleep)
    except DeployError as exc:
        if "still absent" not in str(exc):
            raise
        raise DeployError(
            f"{exc} (the request may still be queued or running: raise --timeout, or read "
            "the object later)"
        ) from None


def invoke_async(
    s3: Any,
    runtime: Any,
    endpoint: str,
    body: bytes,
    input_location: str,
    timeout: float,
    interval: float = 5,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, bytes]:
    """(output location, result body)."""
    s3uri.parse(input_location, "--input-location")
    if timeout < 0:
        raise DeployError(f"--timeout must be 0 or more seconds, got {timeout}")
    input_uri = upload_request(s3, body, input_location)
    output, failure = start(runtime, endpoint, input_uri)
    return output, wait_result(s3, output, failure, timeout, interval, sleep)
