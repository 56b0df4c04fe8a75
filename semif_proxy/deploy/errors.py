"""One error type for every deploy step, with a message that says what to do."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class DeployError(RuntimeError):
    pass


class UsageError(DeployError):
    """Input refused before any AWS call because no AWS call could make it work (a flag missing
    or out of place, an instance type the image cannot run on): the command exits 2, like any
    other usage error."""


@contextmanager
def aws_errors(action: str) -> Iterator[None]:
    """botocore's ClientError, reworded as 'could not <action>: <code>: <message>'."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as exc:
        err = exc.response.get("Error", {})
        raise DeployError(
            f"could not {action}: {err.get('Code', 'error')}: {err.get('Message', exc)}"
        ) from None
    except BotoCoreError as exc:
        raise DeployError(f"could not {action}: {exc}") from None


def poll(
    step: Callable[[], tuple[bool, Any]],
    what: str,
    timeout: float,
    interval: float,
    sleep: Callable[[float], None] = time.sleep,
) -> Any:
    """Call step() until it says done (it raises DeployError itself on failure states)."""
    deadline = time.monotonic() + timeout
    while True:
        done, value = step()
        if done:
            return value
        if time.monotonic() > deadline:
            raise DeployError(f"{what} still {value} after {timeout:.0f}s")
        sleep(interval)
