"""The SageMaker model (image + model data, network isolation on) that `deploy` and `batch`
both run. The model data is a model.tar.gz (ModelDataUrl), or an S3 prefix ending in / that
holds the GGUF as is (`package-model --uncompressed`): ModelDataSource, S3Prefix, no
compression, which SageMaker copies key by key (less the prefix) into /opt/ml/model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from semif_proxy.deploy import names, s3uri
from semif_proxy.deploy.errors import DeployError, aws_errors
from semif_proxy.deploy.image import require_digest


@dataclass(frozen=True)
class Model:
    name: str
    image: str
    model_data: str
    role_arn: str
    gpu_layers: int | None = None
    env: dict[str, str] = field(default_factory=dict)


def container_env(m: Model) -> dict[str, str]:
    env = {"SM_LLAMA_CPP_MODEL_DIR": "/opt/ml/model", **m.env}
    if m.gpu_layers is not None:
        env["SM_LLAMA_CPP_N_GPU_LAYERS"] = str(m.gpu_layers)
    return env


def uncompressed(model_data: str) -> bool:
    """An S3 prefix (package-model --uncompressed) rather than a model.tar.gz."""
    return model_data.endswith("/")


def check_data(model_data: str, flag: str = "--model-data") -> None:
    _, key = s3uri.parse(model_data, flag)
    if uncompressed(model_data):
        if not key.strip("/"):
            raise DeployError(
                f"{flag} {model_data!r} is a whole bucket: give the prefix package-model "
                "--uncompressed printed (SageMaker copies every object under it)"
            )
    elif not model_data.endswith(".tar.gz"):
        raise DeployError(
            f"{flag} must be a model.tar.gz, or the S3 prefix ending in / that package-model "
            f"--uncompressed printed, got {model_data!r}"
        )


def data_source(model_data: str) -> dict[str, Any]:
    """The PrimaryContainer fields that say where the model data is."""
    if uncompressed(model_data):
        return {
            "ModelDataSource": {
                "S3DataSource": {
                    "S3Uri": model_data,
                    "S3DataType": "S3Prefix",
                    "CompressionType": "None",
                }
            }
        }
    return {"ModelDataUrl": model_data}


def check(m: Model, name_flag: str = "--name") -> None:
    names.check(m.name, name_flag)
    require_digest(m.image, "--image")
    check_data(m.model_data)


def create(sagemaker: Any, m: Model) -> None:
    with aws_errors(f"create SageMaker model {m.name!r}"):
        sagemaker.create_model(
            ModelName=m.name,
            ExecutionRoleArn=m.role_arn,
            PrimaryContainer={
                "Image": m.image,
                **data_source(m.model_data),
                "Environment": container_env(m),
            },
            EnableNetworkIsolation=True,
        )


def describe(sagemaker: Any, name: str) -> dict[str, Any] | None:
    """DescribeModel's answer, or None when there is no such model."""
    from botocore.exceptions import ClientError

    try:
        return sagemaker.describe_model(ModelName=name)
    except ClientError as exc:
        if "Could not find model" in exc.response.get("Error", {}).get("Message", ""):
            return None
        with aws_errors(f"look up SageMaker model {name!r}"):
            raise
    raise AssertionError("unreachable")


def exists(sagemaker: Any, name: str) -> bool:
    return describe(sagemaker, name) is not None
