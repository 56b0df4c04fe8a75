"""`semif-proxy package-model`: model.tar.gz with the GGUF at its root plus a manifest, uploaded;
or, with --uncompressed, the GGUF and the manifest as they are under an S3 prefix of their own.

SageMaker unpacks model.tar.gz into /opt/ml/model, or copies each object under the prefix there
(its key less the prefix), where `semif-proxy serve` discovers the GGUF either way. The manifest
lets the server skip hashing a multi-gigabyte file at start-up. Hashing, compressing and
uploading show byte bars on a terminal (progress.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from semif_proxy import progress
from semif_proxy.deploy import s3uri
from semif_proxy.deploy.errors import DeployError, aws_errors
from semif_proxy.model.files import MANIFEST_NAME


def normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Owner root, files 0644, directories 0755, whatever the source's mode or the umask:
    SageMaker unpacks as root; any user reading the GGUF then can."""
    info.mode = 0o755 if info.isdir() else 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def check_gguf(gguf: Path) -> None:
    if not gguf.is_file():
        raise DeployError(f"no such GGUF file: {gguf}")
    with gguf.open("rb") as fh:
        if fh.read(4) != b"GGUF":
            raise DeployError(f"{gguf} is not a GGUF file (bad magic)")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with (
        path.open("rb") as raw,
        progress.bar(path.stat().st_size, f"hashing {path.name}", unit="B") as shown,
    ):
        fh = progress.Reading(raw, shown)
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_for(gguf: Path) -> dict[str, Any]:
    return {"files": [{"file": gguf.name, "bytes": gguf.stat().st_size, "sha256": sha256(gguf)}]}


def build_archive(gguf: Path, out_dir: Path) -> tuple[Path, dict[str, Any]]:
    check_gguf(gguf)
    manifest = manifest_for(gguf)
    archive = out_dir / "model.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:  # GGUF barely compresses
        member = normalize(tar.gettarinfo(gguf, arcname=gguf.name))
        with (
            gguf.open("rb") as raw,
            progress.bar(member.size, f"compressing {gguf.name}", unit="B") as shown,
        ):
            tar.addfile(member, progress.Reading(raw, shown))  # type: ignore[arg-type]
        data = json.dumps(manifest, indent=2).encode()
        info = tarfile.TarInfo(MANIFEST_NAME)
        info.size = len(data)
        info.mtime = int(gguf.stat().st_mtime)
        tar.addfile(normalize(info), io.BytesIO(data))
    return archive, manifest


def require_bucket(s3: Any, bucket: str) -> None:
    with aws_errors(f"use bucket {bucket!r}"):
        s3.head_bucket(Bucket=bucket)


def upload_file(s3: Any, path: Path, bucket: str, key: str) -> None:
    with (
        aws_errors(f"upload {path.name} to s3://{bucket}/{key}"),
        progress.bar(path.stat().st_size, f"uploading {path.name}", unit="B") as shown,
    ):
        s3.upload_file(str(path), bucket, key, Callback=shown.update)


def upload(s3: Any, archive: Path, destination: str) -> str:
    bucket, prefix = s3uri.parse(destination)
    key = s3uri.join(prefix, archive.name)
    require_bucket(s3, bucket)
    upload_file(s3, archive, bucket, key)
    return f"s3://{bucket}/{key}"


def model_prefix(destination: str) -> tuple[str, str]:
    """(bucket, key prefix ending in /) for --uncompressed: never the whole bucket, since
    SageMaker copies every object under the prefix into /opt/ml/model."""
    bucket, prefix = s3uri.parse(destination)
    prefix = prefix.strip("/")
    if not prefix:
        raise DeployError(
            f"--uncompressed needs a prefix of its own under the bucket (s3://{bucket}/<prefix>/)"
            ": SageMaker copies every object under it into /opt/ml/model"
        )
    return bucket, prefix + "/"


def require_only_ours(s3: Any, bucket: str, prefix: str, ours: set[str]) -> None:
    """Refuse a prefix that holds anything but this model's GGUF and manifest (a second GGUF
    there could be the one the server loads)."""
    others: list[str] = []
    with aws_errors(f"list s3://{bucket}/{prefix}"):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            others += [o["Key"] for o in page.get("Contents", []) if o["Key"] not in ours]
            if len(others) >= 3:
                break
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise DeployError(
            f"s3://{bucket}/{prefix} already holds other objects ({shown}); SageMaker copies "
            "every object under the prefix into /opt/ml/model: use an empty prefix"
        )


def upload_uncompressed(s3: Any, gguf: Path, destination: str) -> str:
    """The GGUF as is, then its manifest, under a prefix that holds nothing else; the prefix
    (ending in /) is what deploy takes as --model-data."""
    bucket, prefix = model_prefix(destination)
    check_gguf(gguf)
    gguf_key, manifest_key = prefix + gguf.name, prefix + MANIFEST_NAME
    require_bucket(s3, bucket)
    require_only_ours(s3, bucket, prefix, {gguf_key, manifest_key})
    manifest = manifest_for(gguf)
    upload_file(s3, gguf, bucket, gguf_key)
    with aws_errors(f"upload {MANIFEST_NAME} to s3://{bucket}/{manifest_key}"):
        s3.put_object(
            Bucket=bucket,
            Key=manifest_key,
            Body=json.dumps(manifest, indent=2).encode(),
            ContentType="application/json",
        )
    return f"s3://{bucket}/{prefix}"


def package_model(
    s3: Any, gguf: Path, destination: str, work_dir: Path, uncompressed: bool = False
) -> str:
    """The --model-data URI for deploy: s3://.../model.tar.gz, or with uncompressed the prefix
    s3://.../ that holds the GGUF and its manifest as they are."""
    if uncompressed:
        return upload_uncompressed(s3, gguf, destination)
    bucket, prefix = s3uri.parse(destination)  # fail before hashing gigabytes
    check_gguf(gguf)
    require_bucket(s3, bucket)
    archive, _ = build_archive(gguf, work_dir)
    key = s3uri.join(prefix, archive.name)
    upload_file(s3, archive, bucket, key)
    return f"s3://{bucket}/{key}"
