"""Validating and admitting a ``generate`` request, shared by WebSocket and HTTP."""

from __future__ import annotations

import logging
from typing import Any

import redis.exceptions
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aigcq.domain import ErrorCode
from aigcq.gateway.admission import Admission
from aigcq.gateway.errors import ClientError
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.js_values import IdText, JsonObject, id_text
from aigcq.runtime import Runtime
from aigcq.scheduler.lifecycle import Lifecycle

log = logging.getLogger(__name__)

ID_PATTERN = r"^[A-Za-z0-9_.:\-]{1,128}$"
MAX_BACKEND_ID = 128  # a client's id, on the WebSocket (``id=``) and over HTTP (``backendId``)


class GenerateRequest(BaseModel):
    """Seed 001: ``{"type":"generate", taskId, platform, payload, AIGC?}``, and aigcq's
    ``maxCost?``: the most the task may cost on a paid platform (in the unit of
    ``AIGCQ_OVERFLOW_PRICE``): one expected to cost more is not sent there. As the seed's
    Node.js service read them, an integer ``taskId`` is its decimal text and a ``payload``
    sent as a string holding a JSON object is that object."""

    model_config = ConfigDict(extra="ignore", strict=True)

    taskId: IdText = Field(pattern=ID_PATTERN)
    platform: str = Field(min_length=1, max_length=64)
    payload: JsonObject
    AIGC: str | None = Field(None, min_length=1, max_length=128)
    maxCost: float | None = Field(None, ge=0, allow_inf_nan=False)


def parse_generate(data: dict[str, Any]) -> GenerateRequest:
    try:
        return GenerateRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "message"
        raise ClientError(ErrorCode.JSON, f"{field}: {first['msg']}", _task_id(data)) from exc


def _task_id(data: dict[str, Any]) -> str | None:
    value = id_text(data.get("taskId"))
    return value if isinstance(value, str) else None


class Submission:
    def __init__(self, rt: Runtime, lifecycle: Lifecycle, admission: Admission) -> None:
        self.rt = rt
        self.lifecycle = lifecycle
        self.admission = admission

    async def submit(self, req: GenerateRequest, backend_id: str, *, deliver: bool) -> bool:
        """Queue the task; returns False when it already existed (idempotent re-submit)."""
        aigc = req.AIGC or self.rt.settings.project_prefix
        if self.rt.config.account(aigc, req.platform) is None:
            raise ClientError(
                ErrorCode.PLATFORM, f"unknown platform {req.platform!r} for {aigc!r}", req.taskId
            )
        task = {"taskId": req.taskId, "platform": req.platform, "AIGC": aigc}
        if not await self.admission.admit(backend_id, task):
            raise ClientError(ErrorCode.BALANCE, "admission refused", req.taskId)
        try:
            result = await self.lifecycle.submitted(
                req.taskId,
                (aigc, req.platform),
                backend_id,
                req.payload,
                deliver=deliver,
                max_cost=req.maxCost,
            )
        except redis.exceptions.RedisError as exc:  # the task may exist: its reply was lost
            await self.admission.refund_unless_stored(backend_id, req.taskId)
            log.error(
                "task %s: could not be stored: %r", req.taskId, exc, extra=ctx(task=req.taskId)
            )
            raise ClientError(ErrorCode.ASSESSMENT, "storage unavailable", req.taskId) from exc
        if not result.created:
            await self.admission.refund(backend_id)
            if result.backend_id != backend_id:
                raise ClientError(
                    ErrorCode.CONFLICT, "taskId belongs to another client", req.taskId
                )
        return result.created
