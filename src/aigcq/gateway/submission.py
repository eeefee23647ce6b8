"""Validating and admitting a ``generate`` request, shared by WebSocket and HTTP."""

from __future__ import annotations

import logging
from typing import Any

import redis.exceptions
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aigcq.domain import ErrorCode, Ordering
from aigcq.gateway.admission import Admission
from aigcq.gateway.errors import ClientError
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.js_values import IdText, JsonObject, id_text
from aigcq.runtime import Runtime
from aigcq.scheduler.lifecycle import Lifecycle

log = logging.getLogger(__name__)

ID_PATTERN = r"^[A-Za-z0-9_.:\-]{1,128}$"
MAX_BACKEND_ID = 128  # a client's id, on the WebSocket (``id=``) and over HTTP (``backendId``)
MAX_USER_ID = 128  # an end user's id (``userId``)
MAX_WAIT_MS = 7 * 86400 * 1000  # the longest start deadline a task may ask for (a week)


class GenerateRequest(BaseModel):
    """Seed 001: ``{"type":"generate", taskId, platform, payload, AIGC?}``, and aigcq's
    ``maxCost?``: the most the task may cost on a paid platform (in the unit of
    ``AIGCQ_OVERFLOW_PRICE``): one expected to cost more is not sent there; and when it
    runs (issue 27, docs/scheduling.md): ``priority`` (seconds of credit, at most the
    project's ``AIGCQ_PRIORITY_MAX_S``), ``userId`` (its end user, for fair shares inside
    the project), ``maxWaitMs`` (its start deadline) and ``keepWaiting``; ``traceparent``
    (W3C trace context) puts the task's trace inside the client's. As the seed's
    Node.js service read them, an integer ``taskId`` is its decimal text and a ``payload``
    sent as a string holding a JSON object is that object."""

    model_config = ConfigDict(extra="ignore", strict=True)

    taskId: IdText = Field(pattern=ID_PATTERN)
    platform: str = Field(min_length=1, max_length=64)
    payload: JsonObject
    AIGC: str | None = Field(None, min_length=1, max_length=128)
    maxCost: float | None = Field(None, ge=0, allow_inf_nan=False)
    priority: float | None = Field(None, ge=0, allow_inf_nan=False)
    userId: str | None = Field(None, min_length=1, max_length=MAX_USER_ID)
    maxWaitMs: int | None = Field(None, ge=0, le=MAX_WAIT_MS)
    keepWaiting: bool | None = None
    #: the client's W3C trace context: the task's trace continues the client's own (over
    #: HTTP, its ``traceparent`` header); one that is not a traceparent is ignored
    traceparent: str | None = Field(None, max_length=256)


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

    async def submit(
        self, req: GenerateRequest, backend_id: str, *, deliver: bool, principal: str
    ) -> bool:
        """Queue the task for ``backend_id``, admitted under ``principal`` (whom the token
        speaks for: its quota); returns False when it already existed (idempotent
        re-submit)."""
        aigc = req.AIGC or self.rt.settings.project_prefix
        if self.rt.config.account(aigc, req.platform) is None:
            raise ClientError(
                ErrorCode.PLATFORM, f"unknown platform {req.platform!r} for {aigc!r}", req.taskId
            )
        ordering = self._ordering(req, aigc)
        task = {"taskId": req.taskId, "platform": req.platform, "AIGC": aigc}
        if not await self.admission.admit(principal, task):
            raise ClientError(ErrorCode.BALANCE, "admission refused", req.taskId)
        try:
            result = await self.lifecycle.submitted(
                req.taskId,
                (aigc, req.platform),
                backend_id,
                req.payload,
                deliver=deliver,
                max_cost=req.maxCost,
                ordering=ordering,
                trace=req.traceparent,
            )
        except redis.exceptions.RedisError as exc:  # the task may exist: its reply was lost
            await self.admission.refund_unless_stored(principal, req.taskId)
            log.error(
                "task %s: could not be stored: %r", req.taskId, exc, extra=ctx(task=req.taskId)
            )
            raise ClientError(ErrorCode.ASSESSMENT, "storage unavailable", req.taskId) from exc
        if not result.created:
            await self.admission.refund(principal)
            if result.backend_id != backend_id:
                raise ClientError(
                    ErrorCode.CONFLICT, "taskId belongs to another client", req.taskId
                )
        return result.created

    def _ordering(self, req: GenerateRequest, aigc: str) -> Ordering:
        """When the task runs, as it asked (its project's ``AIGCQ_MAX_WAIT_MS`` when it
        names no ``maxWaitMs``); a priority above its project's bound is refused."""
        credit = req.priority or 0.0
        bound = self.rt.settings.priority_max(aigc)
        if credit > bound:
            raise ClientError(
                ErrorCode.JSON,
                f"priority: at most {bound:g} s for project {aigc!r} (AIGCQ_PRIORITY_MAX_S)",
                req.taskId,
            )
        max_wait_s = (
            req.maxWaitMs / 1000
            if req.maxWaitMs is not None
            else self.rt.settings.default_max_wait_s(aigc)
        )
        return Ordering(
            user=req.userId or "",
            credit_s=credit,
            max_wait_s=max_wait_s,
            keep_waiting=bool(req.keepWaiting),
        )
