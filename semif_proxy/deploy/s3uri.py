"""s3://bucket/key parsing."""

from __future__ import annotations

from urllib.parse import urlparse

from semif_proxy.deploy.errors import DeployError


def parse(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise DeployError(f"not an S3 URI: {uri!r} (expected s3://bucket/prefix/)")
    return parsed.netloc, parsed.path.lstrip("/")


def join(prefix: str, name: str) -> str:
    return f"{prefix.rstrip('/')}/{name}" if prefix else name
