"""s3://bucket/key parsing."""

from __future__ import annotations

from urllib.parse import urlparse

from semif_proxy.deploy.errors import DeployError


def parse(uri: str, flag: str | None = None) -> tuple[str, str]:
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        where = f"{flag}: " if flag else ""
        raise DeployError(f"{where}not an S3 URI: {uri!r} (expected s3://bucket/prefix/)")
    return parsed.netloc, parsed.path.lstrip("/")


def join(prefix: str, name: str) -> str:
    return f"{prefix.rstrip('/')}/{name}" if prefix else name
