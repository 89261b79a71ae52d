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
