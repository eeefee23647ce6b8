"""Error codes of the asynch API and the JSON envelope they are returned in.

Success: ``{"code": "OK", "message": "success", "data": ...}`` with HTTP 200.
Failure: ``{"code": "<CODE>", "message": "<what is wrong>", "data": null}`` with the HTTP status
below. A failed request changes nothing.
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
    Code.MODEL_HOST_NOT_ALLOWED: 403,
    Code.UNAVAILABLE: 503,
    Code.INTERNAL_ERROR: 500,
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
        return {"code": self.code.value, "message": self.message, "data": None}


def ok(data: Any = None) -> dict[str, Any]:
    return {"code": "OK", "message": "success", "data": data}
