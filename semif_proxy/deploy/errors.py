"""One error type for every deploy step, with a message that says what to do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class DeployError(RuntimeError):
    pass


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
