"""`semif-proxy package-model`: model.tar.gz with the GGUF at its root plus a manifest, uploaded.

SageMaker unpacks model.tar.gz into /opt/ml/model, where `semif-proxy serve` discovers the GGUF.
The manifest lets the server skip hashing a multi-gigabyte file at start-up.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

from semif_proxy.deploy import s3uri
from semif_proxy.deploy.errors import DeployError, aws_errors
from semif_proxy.model.files import MANIFEST_NAME, file_sha256


def normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Owner root, files 0644, directories 0755, whatever the source's mode or the umask:
    SageMaker unpacks as root; any user reading the GGUF then can."""
    info.mode = 0o755 if info.isdir() else 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def build_archive(gguf: Path, out_dir: Path) -> tuple[Path, dict[str, Any]]:
    if not gguf.is_file():
        raise DeployError(f"no such GGUF file: {gguf}")
    with gguf.open("rb") as fh:
        if fh.read(4) != b"GGUF":
            raise DeployError(f"{gguf} is not a GGUF file (bad magic)")
    manifest = {
        "files": [{"file": gguf.name, "bytes": gguf.stat().st_size, "sha256": file_sha256(gguf)}]
    }
    archive = out_dir / "model.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:  # GGUF barely compresses
        tar.add(gguf, arcname=gguf.name, filter=normalize)
        data = json.dumps(manifest, indent=2).encode()
        info = tarfile.TarInfo(MANIFEST_NAME)
        info.size = len(data)
        info.mtime = int(gguf.stat().st_mtime)
        tar.addfile(normalize(info), io.BytesIO(data))
    return archive, manifest


def upload(s3: Any, archive: Path, destination: str) -> str:
    bucket, prefix = s3uri.parse(destination)
    key = s3uri.join(prefix, archive.name)
    with aws_errors(f"use bucket {bucket!r}"):
        s3.head_bucket(Bucket=bucket)
    with aws_errors(f"upload {archive.name} to s3://{bucket}/{key}"):
        s3.upload_file(str(archive), bucket, key)
    return f"s3://{bucket}/{key}"


def package_model(s3: Any, gguf: Path, destination: str, work_dir: Path) -> str:
    s3uri.parse(destination)  # fail before hashing gigabytes
    archive, _ = build_archive(gguf, work_dir)
    return upload(s3, archive, destination)
