"""SageMaker resource names: checked before any call, and names made unique with a timestamp
(transform jobs; each deploy's model and endpoint config)."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from semif_proxy.deploy.errors import DeployError

# Models, endpoints, endpoint configs and transform jobs share this rule.
MAX_LEN = 63
# The one production variant of every endpoint `deploy` creates.
VARIANT = "AllTraffic"
_VALID = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")


def check(name: str, flag: str) -> None:
    if len(name) > MAX_LEN or not _VALID.fullmatch(name):
        raise DeployError(
            f"{flag} must be 1-{MAX_LEN} letters, digits and hyphens, starting and ending with a "
            f"letter or digit, got {name!r}"
        )


def job_name(model_name: str, now: datetime | None = None) -> str:
    """A transform job's name: stamped(model name)."""
    return stamped(model_name, now)


def stamped(name: str, now: datetime | None = None) -> str:
    """<name, shortened>-<UTC timestamp to the millisecond>: unique per start, valid. Transform
    jobs, and the model and endpoint config of each `deploy` (endpoint <name>), are named so."""
    now = now or datetime.now(timezone.utc)
    stamp = now.strftime("%Y%m%d-%H%M%S-") + f"{now.microsecond // 1000:03d}"
    base = re.sub(r"[^a-zA-Z0-9-]", "-", name)[: MAX_LEN - len(stamp) - 1].strip("-")
    return f"{base}-{stamp}" if base else stamp
