"""Domain errors, each with the HTTP status and the stable JSON error shape it maps to."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    status = 400
    type = "invalid_request"

    def __init__(self, message: str, *, field: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.extra = extra
        self.headers: dict[str, str] = {}

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        error.update(self.extra)
        return {"error": error}


class InvalidRequest(ApiError):
    pass


def internal_error() -> ApiError:
    """A bug of ours: the body says only where to look (the log line under the request id)."""
    error = ApiError("internal error; see the server log for this request id")
    error.status, error.type = 500, "internal_error"
    return error


class PayloadTooLarge(ApiError):
    status = 413
    type = "too_large"


class UnsupportedMediaType(ApiError):
    status = 415
    type = "unsupported_media_type"


class Unauthorized(ApiError):
    status = 401
    type = "unauthorized"


class Overloaded(ApiError):
    status = 503
    type = "overloaded"

    def __init__(self, message: str, retry_after: int = 1, **extra: Any) -> None:
        super().__init__(message, **extra)
        self.headers["Retry-After"] = str(retry_after)


class Unavailable(ApiError):
    status = 503
    type = "unavailable"

    def __init__(self, message: str, retry_after: int = 2, **extra: Any) -> None:
        super().__init__(message, **extra)
        self.headers["Retry-After"] = str(retry_after)


class UpstreamError(ApiError):
    """llama-server failed the call (it died, restarts, or broke the connection): worth a retry
    once the supervisor has it back, so 503 with Retry-After rather than a bare 502."""

    status = 503
    type = "upstream_error"

    def __init__(self, message: str, retry_after: int = 2, **extra: Any) -> None:
        super().__init__(message, **extra)
        self.headers["Retry-After"] = str(retry_after)


class Timeout(ApiError):
    status = 504
    type = "timeout"


class Cancelled(ApiError):
    """The caller went away or its deadline passed while its work ran; nobody reads this."""

    status = 499
    type = "cancelled"


class NotFound(ApiError):
    status = 404
    type = "not_found"


class EngineFailure(ApiError):
    """llama.cpp refused a forward pass that passed validation (e.g. out of KV memory)."""

    status = 503
    type = "engine_error"


class SchemaError(ApiError):
    """422 in FastAPI's shape, which System One clients (and their SDKs) parse."""

    status = 422
    type = "unprocessable_entity"

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        first = detail[0] if detail else {"msg": "invalid request"}
        super().__init__(str(first.get("msg")))
        self.detail = detail

    def body(self) -> dict[str, Any]:
        return {"detail": self.detail}
