"""The message-dispatcher adapter (seed 000 §3.2.1, §3.3): RunningHub's adapter with
another base URL, ``POST /api/task`` for submits and a JWT as ``apiKey``.

The request body is built by :class:`RunningHubAdapter` itself, so it equals RunningHub's
field for field except the ``apiKey`` value. Submit answers ``{success, data: {requestId,
taskId}}`` are mapped to RunningHub's ``{code: 0, msg, data: {taskId: requestId}}``
(§3.3.3); results come back as RunningHub ``TASK_END`` webhooks, and the dispatcher's
RunningHub-compatible ``/task/openapi/*`` routes answer queries and cancels.

It serves no task platform by itself (``serves = ()``): it is never picked as the paid
overflow target of ``comfyui`` (that stays ``runninghub``); ``aigcq serve`` uses it as
its *internal* target (:mod:`aigcq.mdclient.target`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

from aigcq.domain import Task
from aigcq.platforms._parse import http_outcome
from aigcq.platforms.base import Full, HttpRequest, Rejected, SubmitOutcome
from aigcq.platforms.registry import PlatformSpec, register
from aigcq.platforms.runninghub import RunningHubAdapter

SUBMIT_PATH = "/api/task"
#: code of a submit refused with 401: our JWT lapsed or was revoked; log in again and retry.
TOKEN_REFUSED = "MD_TOKEN_REFUSED"


def to_runninghub(body: dict[str, Any]) -> dict[str, Any]:
    """§3.3.3: a successful dispatcher answer in RunningHub's submit format."""
    data = body.get("data")
    request_id = data.get("requestId") if isinstance(data, dict) else None
    return {"code": 0, "msg": "success", "data": {"taskId": request_id}}


class MessageDispatcherAdapter(RunningHubAdapter):
    name = "message_dispatcher"
    paid = False
    kind = "callback"
    serves: ClassVar[tuple[str, ...]] = ()

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url)
        #: the current JWT, when a JWT manager is attached; it replaces the ``apikey`` that
        #: other components (deadline sweeper, client cancels) pass from model.json.
        self.token: Callable[[], str | None] = lambda: None

    def _key(self, apikey: str) -> str:
        return self.token() or apikey

    def submit_request(self, task: Task, apikey: str, webhook_url: str) -> HttpRequest:
        req = super().submit_request(task, self._key(apikey), webhook_url)
        return replace(req, url=self.base_url + SUBMIT_PATH)

    def query_request(self, task: Task, apikey: str) -> HttpRequest:
        return super().query_request(task, self._key(apikey))

    def cancel_request(self, task: Task, apikey: str) -> HttpRequest | None:
        return super().cancel_request(task, self._key(apikey))

    def parse_submit(self, status: int, body: Any) -> SubmitOutcome:
        if status == 401:
            error = body.get("error") if isinstance(body, dict) else None
            return Rejected(TOKEN_REFUSED, "token refused", retryable=True, detail=error)
        if not isinstance(body, dict) or "success" not in body:
            return http_outcome("MD", status)
        if body["success"] is True:
            return super().parse_submit(status, to_runninghub(body))
        error = body.get("error")
        error = error if isinstance(error, dict) else {}
        code, message = str(error.get("code") or status), str(error.get("message") or "")
        if status == 503:
            return Full(f"MD {code} {message}".rstrip())
        retryable = status >= 500  # transient
        return Rejected(f"MD_{code}", message, retryable=retryable, detail=body.get("error"))


SPEC = register(PlatformSpec(MessageDispatcherAdapter))
