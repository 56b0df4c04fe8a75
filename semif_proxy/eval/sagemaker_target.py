"""The eval target that is a SageMaker endpoint: sagemaker-runtime InvokeEndpoint with the
request body as /invocations gets it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from semif_proxy.eval.targets import (
    Answer,
    Failure,
    TargetError,
    answer_or_failure,
    error_body,
)


@dataclass
class SageMakerTarget:
    """A SageMaker endpoint: InvokeEndpoint with the request body as JSON; /invocations
    routes it by its shape, so System One and decision rows both work."""

    name: str
    endpoint: str
    client: Any = field(default=None, repr=False)

    @classmethod
    def connect(cls, name: str, endpoint: str, region: str | None = None) -> SageMakerTarget:
        try:
            import boto3
        except ImportError:
            raise TargetError(
                f"{name}: boto3 is not installed (pip install 'semif-proxy[aws]')"
            ) from None
        return cls(name, endpoint, boto3.client("sagemaker-runtime", region_name=region))

    def ask(self, route: str, body: dict[str, Any]) -> Answer | Failure:
        from botocore.exceptions import BotoCoreError, ClientError

        start = time.perf_counter()
        try:
            response = self.client.invoke_endpoint(
                EndpointName=self.endpoint,
                ContentType="application/json",
                Body=json.dumps(body).encode(),
            )
            raw = response["Body"].read()
        except ClientError as exc:
            # A ModelError carries what the container answered (its status and body).
            original = exc.response.get("OriginalMessage")
            status = exc.response.get("OriginalStatusCode") or exc.response.get(
                "ResponseMetadata", {}
            ).get("HTTPStatusCode")
            body = (
                error_body(original.encode())
                if isinstance(original, str)
                else exc.response.get("Error")
            )
            return Failure(str(exc), time.perf_counter() - start, status, body)
        except BotoCoreError as exc:
            return Failure(f"{type(exc).__name__}: {exc}", time.perf_counter() - start)
        return answer_or_failure(route, raw, time.perf_counter() - start)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "sagemaker", "endpoint": self.endpoint}

    def interrupt(self) -> None:
        pass  # the call in progress finishes (boto3 has no way to abort it)

    def close(self) -> None:
        pass
