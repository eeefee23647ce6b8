"""The Comfy API v2 error envelope: ``{"error": {"code", "message", "details"}}``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse


class V2Error(Exception):
    """An answer in the v2 error envelope: ``{"error": {"code", "message", "details"}}``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = dict(headers or {})

    def response(self) -> JSONResponse:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            error["details"] = self.details
        return JSONResponse({"error": error}, self.status, headers=self.headers)


async def v2_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, V2Error)
    return exc.response()
