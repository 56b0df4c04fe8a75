"""The SageMaker model (image + model.tar.gz, network isolation on) that `deploy` and `batch`
both run."""

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


def check(m: Model, name_flag: str = "--name") -> None:
    names.check(m.name, name_flag)
    require_digest(m.image, "--image")
    s3uri.parse(m.model_data)
    if not m.model_data.endswith(".tar.gz"):
        raise DeployError(f"--model-data must be a model.tar.gz, got {m.model_data!r}")


def create(sagemaker: Any, m: Model) -> None:
    with aws_errors(f"create SageMaker model {m.name!r}"):
        sagemaker.create_model(
            ModelName=m.name,
            ExecutionRoleArn=m.role_arn,
            PrimaryContainer={
                "Image": m.image,
                "ModelDataUrl": m.model_data,
                "Environment": container_env(m),
            },
            EnableNetworkIsolation=True,
        )


def exists(sagemaker: Any, name: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        sagemaker.describe_model(ModelName=name)
    except ClientError as exc:
        if "Could not find model" in exc.response.get("Error", {}).get("Message", ""):
            return False
        with aws_errors(f"look up SageMaker model {name!r}"):
            raise
    return True
