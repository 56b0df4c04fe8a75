"""Finding the GGUF to serve and fingerprinting it once."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
# Written by `semif-proxy package-model` next to the GGUF in model.tar.gz.
MANIFEST_NAME = "semif-manifest.json"


class ModelNotFoundError(ValueError):
    pass


def _is_candidate(path: Path) -> bool:
    if not path.is_file() or path.suffix != ".gguf":
        return False
    shard = _SHARD.search(path.name)
    # Of a split GGUF only the first shard is loaded; llama.cpp finds the others itself.
    return shard is None or shard.group(1) == "00001"


def discover_model(model_dir: Path) -> Path:
    """First *.gguf directly in model_dir, else one level below; sorted, so deterministic."""
    if not model_dir.is_dir():
        raise ModelNotFoundError(f"model directory {model_dir} does not exist")
    direct = sorted(p for p in model_dir.iterdir() if _is_candidate(p))
    if direct:
        return direct[0]
    nested = sorted(
        p
        for d in sorted(model_dir.iterdir())
        if d.is_dir()
        for p in d.iterdir()
        if _is_candidate(p)
    )
    if nested:
        return nested[0]
    seen = sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*"))[:50]
    raise ModelNotFoundError(
        f"no .gguf file in {model_dir} or one level below; found: {seen or 'nothing'}"
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _manifest_sha256(path: Path, size: int) -> str | None:
    try:
        manifest = json.loads((path.parent / MANIFEST_NAME).read_text())
        for entry in manifest.get("files", []):
            if entry.get("file") == path.name and entry.get("bytes") == size:
                sha = str(entry.get("sha256", ""))
                return sha if re.fullmatch(r"[0-9a-f]{64}", sha) else None
    except (OSError, ValueError, AttributeError):
        pass
    return None


def model_sha256(path: Path) -> str:
    """sha256 of the GGUF: from the package manifest when it names this file and size, else
    computed and cached beside the model keyed by size+mtime."""
    stat = path.stat()
    from_manifest = _manifest_sha256(path, stat.st_size)
    if from_manifest:
        return from_manifest
    key = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    sidecar = path.with_name(path.name + ".sha256.json")
    try:
        cached = json.loads(sidecar.read_text())
        if cached.get("key") == key and re.fullmatch(r"[0-9a-f]{64}", cached.get("sha256", "")):
            return str(cached["sha256"])
    except (OSError, ValueError):
        pass
    sha = file_sha256(path)
    try:
        sidecar.write_text(json.dumps({"key": key, "sha256": sha}))
    except OSError:
        pass  # read-only model dirs (SageMaker's /opt/ml/model) just hash again next start
    return sha
