"""Error codes of the asynch API and the JSON envelope they are returned in.

Success: ``{"code": 0, "message": "success", "data": ...}`` with HTTP 200.
Failure: ``{"code": <number>, "reason": "<CODE>", "message": "<what is wrong>", "data": null}``
with the HTTP status below. A failed request changes nothing.

``code`` is a number, as the original Go service (GoFrame) answered: 0 for success, GoFrame's
``gcode`` number of the refusal's class otherwise (``NUMBER``), so a Go caller's
``json.Unmarshal`` into ``{Code int}`` and its ``Code != 0`` check work unchanged. ``reason``
names the refusal exactly (several reasons share a number) and the HTTP status carries its
class for any HTTP client (see docs/compatibility.md).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Code(StrEnum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    INVALID_HEAD_MSG = "INVALID_HEAD_MSG"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    MODEL_NOT_FOUND = "MODEL_NOT_FOUND"
    MODEL_EXISTS = "MODEL_EXISTS"
    MODEL_DISABLED = "MODEL_DISABLED"
    MODEL_BUSY = "MODEL_BUSY"
    MODEL_TYPE_NOT_FOUND = "MODEL_TYPE_NOT_FOUND"
    MODEL_TYPE_EXISTS = "MODEL_TYPE_EXISTS"
    PROMPTS_CORE_SYNC_FAILED = "PROMPTS_CORE_SYNC_FAILED"
    QUEUE_FULL = "QUEUE_FULL"
    TASK_NOT_FOUND = "TASK_NOT_FOUND"
    FILE_NOT_FOUND = "FILE_NOT_FOUND"
    NOT_FOUND = "NOT_FOUND"  # no such endpoint
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    UNAUTHORIZED = "UNAUTHORIZED"  # a management route without the admin token
    FORBIDDEN = "FORBIDDEN"  # /admin/overview while no admin token is configured
    MODEL_HOST_NOT_ALLOWED = "MODEL_HOST_NOT_ALLOWED"
    UNAVAILABLE = "UNAVAILABLE"  # PostgreSQL or Redis unreachable: try again (Retry-After)
    INTERNAL_ERROR = "INTERNAL_ERROR"  # a bug: logged with its traceback


STATUS: dict[Code, int] = {
    Code.INVALID_ARGUMENT: 400,
    Code.INVALID_HEAD_MSG: 400,
    Code.PAYLOAD_TOO_LARGE: 413,
    Code.MODEL_NOT_FOUND: 404,
    Code.MODEL_EXISTS: 409,
    Code.MODEL_DISABLED: 409,
    Code.MODEL_BUSY: 409,
    Code.MODEL_TYPE_NOT_FOUND: 404,
    Code.MODEL_TYPE_EXISTS: 409,
    Code.PROMPTS_CORE_SYNC_FAILED: 502,
    Code.QUEUE_FULL: 429,
    Code.TASK_NOT_FOUND: 404,
    Code.FILE_NOT_FOUND: 404,
    Code.NOT_FOUND: 404,
    Code.METHOD_NOT_ALLOWED: 405,
    Code.UNAUTHORIZED: 401,
    Code.FORBIDDEN: 403,
    Code.MODEL_HOST_NOT_ALLOWED: 403,
    Code.UNAVAILABLE: 503,
    Code.INTERNAL_ERROR: 500,
}
#: The envelope's ``code`` of a success.
OK = 0
# GoFrame's gcode numbers (errors/gcode/gcode.go), the classes the Go service answered with.
_INTERNAL_ERROR, _VALIDATION_FAILED, _OPERATION_FAILED = 50, 51, 60
_NOT_AUTHORIZED, _SECURITY_REASON, _SERVER_BUSY = 61, 62, 63
_RESOURCE_NOT_EXIST, _INVALID_REQUEST, _BUSINESS_VALIDATION_FAILED = 65, 66, 300
#: The envelope's ``code`` of each refusal.
NUMBER: dict[Code, int] = {
    Code.INVALID_ARGUMENT: _VALIDATION_FAILED,
    Code.INVALID_HEAD_MSG: _VALIDATION_FAILED,
    Code.PAYLOAD_TOO_LARGE: _INVALID_REQUEST,
    Code.MODEL_NOT_FOUND: _RESOURCE_NOT_EXIST,
    Code.MODEL_EXISTS: _BUSINESS_VALIDATION_FAILED,
    Code.MODEL_DISABLED: _BUSINESS_VALIDATION_FAILED,
    Code.MODEL_BUSY: _BUSINESS_VALIDATION_FAILED,
    Code.MODEL_TYPE_NOT_FOUND: _RESOURCE_NOT_EXIST,
    Code.MODEL_TYPE_EXISTS: _BUSINESS_VALIDATION_FAILED,
    Code.PROMPTS_CORE_SYNC_FAILED: _OPERATION_FAILED,
    Code.QUEUE_FULL: _SERVER_BUSY,
    Code.TASK_NOT_FOUND: _RESOURCE_NOT_EXIST,
    Code.FILE_NOT_FOUND: _RESOURCE_NOT_EXIST,
    Code.NOT_FOUND: _RESOURCE_NOT_EXIST,
    Code.METHOD_NOT_ALLOWED: _INVALID_REQUEST,
    Code.UNAUTHORIZED: _NOT_AUTHORIZED,
    Code.FORBIDDEN: _NOT_AUTHORIZED,
    Code.MODEL_HOST_NOT_ALLOWED: _SECURITY_REASON,
    Code.UNAVAILABLE: _SERVER_BUSY,
    Code.INTERNAL_ERROR: _INTERNAL_ERROR,
}
#: Seconds a client should wait before trying again after ``UNAVAILABLE``.
RETRY_AFTER_SECONDS = 2


class AsynchError(Exception):
    """A refused request: a code, a message for the caller, and no change made."""

    def __init__(self, code: Code, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return STATUS[self.code]

    def body(self) -> dict[str, Any]:
        return {
            "code": NUMBER[self.code],
            "reason": self.code.value,
            "message": self.message,
            "data": None,
        }


def ok(data: Any = None) -> dict[str, Any]:
    return {"code": OK, "message": "success", "data": data}
