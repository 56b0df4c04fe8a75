"""SageMaker endpoints, endpoint configs and models, one at a time: described (None when
missing), deleted (False when missing), and which models the endpoint configs named like an
endpoint still use."""

from __future__ import annotations

from typing import Any

from semif_proxy.deploy.errors import aws_errors


def _not_found(exc: Any, what: str) -> bool:
    """SageMaker's answer for a missing resource: ValidationException 'Could not find <what>'."""
    return f"Could not find {what}" in exc.response.get("Error", {}).get("Message", "")


def describe_endpoint(sagemaker: Any, name: str) -> dict[str, Any] | None:
    """DescribeEndpoint's answer, or None when there is no such endpoint."""
    from botocore.exceptions import ClientError

    try:
        return sagemaker.describe_endpoint(EndpointName=name)
    except ClientError as exc:
        if _not_found(exc, "endpoint"):
            return None
        with aws_errors(f"describe endpoint {name!r}"):
            raise
    raise AssertionError("unreachable")


def describe_config(sagemaker: Any, name: str) -> dict[str, Any] | None:
    """DescribeEndpointConfig's answer, or None when there is no such endpoint config."""
    from botocore.exceptions import ClientError

    try:
        return sagemaker.describe_endpoint_config(EndpointConfigName=name)
    except ClientError as exc:
        if _not_found(exc, "endpoint config"):
            return None
        with aws_errors(f"describe endpoint config {name!r}"):
            raise
    raise AssertionError("unreachable")


def config_models(config: dict[str, Any]) -> list[str]:
    variants = config.get("ProductionVariants", []) + config.get("ShadowProductionVariants", [])
    return list(dict.fromkeys(v["ModelName"] for v in variants if v.get("ModelName")))


def models_in_use(sagemaker: Any, endpoint_name: str) -> dict[str, str]:
    """{model: an endpoint config that names it} over the endpoint configs whose names contain
    the endpoint's (every config deploy made for it; not the whole account, which may hold
    thousands)."""
    used: dict[str, str] = {}
    with aws_errors(f"list endpoint configs named like {endpoint_name!r}"):
        pages = sagemaker.get_paginator("list_endpoint_configs").paginate(
            NameContains=endpoint_name
        )
        config_names = [c["EndpointConfigName"] for p in pages for c in p["EndpointConfigs"]]
    for name in config_names:
        config = describe_config(sagemaker, name)
        for m in config_models(config or {}):
            used.setdefault(m, name)
    return used


_DELETE = {
    "endpoint": ("delete_endpoint", "EndpointName"),
    "endpoint config": ("delete_endpoint_config", "EndpointConfigName"),
    "model": ("delete_model", "ModelName"),
}


def delete_one(sagemaker: Any, what: str, name: str) -> bool:
    """Delete the endpoint, endpoint config or model `name`; False when there is none."""
    from botocore.exceptions import ClientError

    method, arg = _DELETE[what]
    try:
        getattr(sagemaker, method)(**{arg: name})
    except ClientError as exc:
        if _not_found(exc, what):
            return False
        with aws_errors(f"delete {what} {name!r}"):
            raise
    return True
