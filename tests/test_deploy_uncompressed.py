"""`package-model --uncompressed` against moto (S3, SageMaker): the GGUF and its manifest as they
are under a prefix of their own, the model created with ModelDataSource (S3Prefix, no
compression), and the server finding that layout in /opt/ml/model."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from semif_proxy.cli import main
from semif_proxy.deploy import batch, endpoint, package
from semif_proxy.deploy.errors import DeployError
from semif_proxy.model.files import MANIFEST_NAME, discover_model, file_sha256, model_sha256
from tests.test_deploy import REGION, ROLE, Calls, aws, deployment  # noqa: F401 (aws: autouse)
from tests.test_deploy_batch import transform


def copy_prefix_like_sagemaker(s3: object, uri: str, model_dir: Path) -> None:
    """What SageMaker does with S3Prefix + CompressionType None: each object under the prefix
    to /opt/ml/model/<its key less the prefix>."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)  # type: ignore[attr-defined]
    for obj in listed["Contents"]:
        target = model_dir / obj["Key"][len(prefix) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()  # type: ignore[attr-defined]
        target.write_bytes(body)


def test_uncompressed_upload_is_found_by_the_server(tiny_model: Path, tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="models")
    calls = Calls(s3)
    uri = package.package_model(s3, tiny_model, "s3://models/big", tmp_path, uncompressed=True)
    assert uri == "s3://models/big/"  # a prefix, ending in /: deploy's --model-data
    assert calls.names()[:2] == ["HeadBucket", "ListObjectsV2"]  # checked before hashing
    listed = s3.list_objects_v2(Bucket="models")["Contents"]
    assert sorted(o["Key"] for o in listed) == sorted(
        [f"big/{tiny_model.name}", f"big/{MANIFEST_NAME}"]
    )  # no model.tar.gz
    gguf = s3.get_object(Bucket="models", Key=f"big/{tiny_model.name}")["Body"].read()
    assert gguf == tiny_model.read_bytes()  # as is
    assert list(tmp_path.iterdir()) == []  # nothing written locally
    # The container: discover_model finds the GGUF at the top of /opt/ml/model, and the
    # manifest beside it spares the hashing (no sidecar written).
    model_dir = tmp_path / "opt-ml-model"
    copy_prefix_like_sagemaker(s3, uri, model_dir)
    found = discover_model(model_dir)
    assert found == model_dir / tiny_model.name
    manifest = json.loads((model_dir / MANIFEST_NAME).read_text())
    assert manifest["files"] == [
        {
            "file": tiny_model.name,
            "bytes": tiny_model.stat().st_size,
            "sha256": file_sha256(tiny_model),
        }
    ]
    assert model_sha256(found) == file_sha256(tiny_model)
    assert not found.with_name(found.name + ".sha256.json").exists()
    # Packaging the same GGUF to the same prefix again overwrites it.
    again = package.package_model(s3, tiny_model, "s3://models/big/", tmp_path, uncompressed=True)
    assert again == uri


def test_uncompressed_needs_a_prefix_of_its_own(tiny_model: Path, tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="models")
    s3.put_object(Bucket="models", Key="shared/other.gguf", Body=b"GGUF")
    s3.put_object(Bucket="models", Key="shared/model.tar.gz", Body=b"x")
    calls = Calls(s3)
    with pytest.raises(DeployError, match=r"s3://models/shared/ already holds other objects"):
        package.package_model(s3, tiny_model, "s3://models/shared/", tmp_path, uncompressed=True)
    assert calls.names() == ["HeadBucket", "ListObjectsV2"]  # nothing uploaded
    with pytest.raises(DeployError, match="needs a prefix of its own"):
        package.package_model(s3, tiny_model, "s3://models/", tmp_path, uncompressed=True)
    with pytest.raises(DeployError, match="not a GGUF"):
        text = tmp_path / "notes.gguf"
        text.write_text("hello")
        package.package_model(s3, text, "s3://models/new/", tmp_path, uncompressed=True)


def test_deploy_of_an_uncompressed_model() -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    calls = Calls(sm)
    endpoint.deploy(sm, deployment(model_data="s3://models/big/"))
    container = calls.params("CreateModel")["PrimaryContainer"]
    assert container["ModelDataSource"] == {
        "S3DataSource": {
            "S3Uri": "s3://models/big/",
            "S3DataType": "S3Prefix",
            "CompressionType": "None",
        }
    }
    assert "ModelDataUrl" not in container
    assert container["Environment"]["SM_LLAMA_CPP_MODEL_DIR"] == "/opt/ml/model"


@pytest.mark.parametrize(
    ("model_data", "message"),
    [
        ("s3://models/big/model.gguf", "must be a model.tar.gz, or the S3 prefix ending in /"),
        ("s3://models/", "is a whole bucket"),
        ("models/big/", "not an S3 URI"),
    ],
)
def test_bad_model_data_is_refused_before_any_call(model_data: str, message: str) -> None:
    sm = boto3.client("sagemaker", region_name=REGION)
    calls = Calls(sm)
    with pytest.raises(DeployError, match=message):
        endpoint.deploy(sm, deployment(model_data=model_data))
    assert calls.made == []


def test_batch_refuses_uncompressed_model_data() -> None:
    """CreateTransformJob refuses a model with ModelDataSource: said before any job starts."""
    sm = boto3.client("sagemaker", region_name=REGION)
    calls = Calls(sm)
    model = deployment(model_data="s3://models/big/").as_model()
    with pytest.raises(DeployError, match="Batch Transform does not take uncompressed"):
        batch.run(sm, transform(), model, wait=None)
    assert calls.made == []
    deployed = endpoint.deploy(sm, deployment(model_data="s3://models/big/"))["ModelName"]
    calls = Calls(sm)
    with pytest.raises(DeployError, match=f"model '{deployed}': Batch Transform does not take"):
        batch.run(sm, transform(model_name=deployed), None, wait=None)
    assert calls.names() == ["DescribeModel"]


def test_package_model_command_uncompressed(
    tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    boto3.client("s3", region_name=REGION).create_bucket(Bucket="cli-models")
    args = ["package-model", "--gguf", str(tiny_model), "--s3", "s3://cli-models/q/"]
    assert main([*args, "--uncompressed"]) == 0
    assert capsys.readouterr().out.strip() == "s3://cli-models/q/"
    with pytest.raises(SystemExit):
        main(["package-model", "--help"])
    assert "(default: off, a model.tar.gz)" in " ".join(capsys.readouterr().out.split())
