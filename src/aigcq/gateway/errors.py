"""Client-facing errors: a code (code.json key), a message and a detail."""

from __future__ import annotations

from typing import Any

from aigcq.config import Messages
from aigcq.domain import ErrorCode

HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.JSON: 400,
    ErrorCode.OPCODE: 400,
    ErrorCode.AUTH: 401,
    ErrorCode.BALANCE: 402,
    ErrorCode.SIGNATURE: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.CONFLICT: 409,
    ErrorCode.NOT_RETRYABLE: 409,
    ErrorCode.GONE: 410,
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
