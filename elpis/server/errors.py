"""OpenAI-style errors: one exception type, one body shape, one status-to-type rule."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """A request that gets an error answer: HTTP status, OpenAI `code`, a message and the field at fault."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str = "invalid_request",
        param: str | None = None,
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}
        self.close = close  # close the connection after answering (body left unread)

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.code, self.param)


def error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(status: int, message: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str = "invalid_request") -> APIError:
    return APIError(400, message, code=code, param=param)


# Anthropic's error types by status (their API reference); 4xx statuses without a type of their own are
# invalid_request_error there too.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    500: "api_error", 529: "overloaded_error"}
# 503s that clear by themselves (the client should retry) read as overloaded; the rest as api_error.
_TRANSIENT = frozenset({"model_loading", "server_shutting_down"})


def anthropic_error_type(status: int, code: str) -> str:
    if status == 503:
        return "overloaded_error" if code in _TRANSIENT else "api_error"
    if status in _ANTHROPIC_TYPES:
        return _ANTHROPIC_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def anthropic_error_body(err: APIError) -> dict[str, Any]:
    """Anthropic's envelope. It has no `param`: the field at fault leads the message instead."""
    message = err.message
    if err.param and err.param not in message:
        message = f"{err.param}: {message}"
    kind = anthropic_error_type(err.status, err.code)
    return {"type": "error", "error": {"type": kind, "message": message}}
