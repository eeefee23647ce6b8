"""Client-facing errors: a code (code.json key), a message and a detail."""

from __future__ import annotations

from typing import Any, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel

from aigcq.config import Messages
from aigcq.domain import ErrorCode

HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.JSON: 400,
    ErrorCode.OPCODE: 400,
    ErrorCode.CONTROL: 400,
    ErrorCode.AUTH: 401,
    ErrorCode.BALANCE: 402,
    ErrorCode.SIGNATURE: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.BRIDGE_NOT_FOUND: 404,
    ErrorCode.CONFLICT: 409,
    ErrorCode.NOT_RETRYABLE: 409,
    ErrorCode.GONE: 410,
    ErrorCode.LINK_EXPIRED: 410,
    ErrorCode.FILE_NOT_FOUND: 404,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.PLATFORM: 422,
    ErrorCode.ASSESSMENT: 503,
}


class ClientError(Exception):
    def __init__(self, code: ErrorCode, detail: str = "", task_id: str | None = None) -> None:
        super().__init__(f"{code.value}: {detail}")
        self.code = code
        self.detail = detail
        self.task_id = task_id

    @property
    def status(self) -> int:
        return HTTP_STATUS.get(self.code, 400)

    def body(self, messages: Messages) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": "error",
            "code": self.code.value,
            "msg": messages.get(self.code.value),
            "detail": self.detail,
        }
        if self.task_id:
            body["taskId"] = self.task_id
        return body


class ErrorBody(BaseModel):
    """Every error answer of the HTTP API (and the client WebSocket's ``error`` message)."""

    type: Literal["error"] = "error"
    code: str
    msg: str
    detail: Any = None
    taskId: str | None = None


def error_responses(*codes: ErrorCode) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for a route answering with these codes: their statuses, each
    described by the codes it carries, all with the :class:`ErrorBody` schema."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(HTTP_STATUS.get(code, 400), []).append(code.value)
    return {
        status: {"model": ErrorBody, "description": " / ".join(names)}
        for status, names in sorted(by_status.items())
    }


def as_client_error(exc: RequestValidationError) -> ClientError:
    """FastAPI's validation failure (``?limit=abc``) as aigcq's ``JSONError`` (400), naming
    the field, like every other bad input (FastAPI's own answer would be a 422)."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", ())) or "request"
    return ClientError(ErrorCode.JSON, f"{where}: {first.get('msg', 'invalid')}")
