"""RunningHub's formats on the message-dispatcher: create bodies in, ``/outputs`` answers
and ``TASK_END`` webhooks out (the original system's dispatcher contract, platform-apis.md §1).

A create body is checked against the bridge protocol's TASK_ASSIGN model, so anything we
accept is something a bridge can run.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError

from aigcq.domain import Task, TaskState
from aigcq.wire.bridge import TaskAssignData

QUEUED = {"code": 813, "msg": "APIKEY_TASK_IS_QUEUED", "data": None}
RUNNING = {"code": 804, "msg": "APIKEY_TASK_IS_RUNNING", "data": None}
TASK_FAILED = (805, "APIKEY_TASK_STATUS_ERROR")

_STATUS = {
    TaskState.PENDING: "QUEUED",
    TaskState.DISPATCHING: "RUNNING",
    TaskState.RUNNING: "RUNNING",
    TaskState.SUCCESS: "SUCCESS",
}


class BadBody(ValueError):
    """A create body we cannot queue; the message names the field."""


#: snake_case names the original system's callers send (its own example body uses
#: ``workflow_id`` / ``node_info_list``), read as RunningHub's camelCase.
_SNAKE = {
    "workflow_id": "workflowId",
    "node_info_list": "nodeInfoList",
    "webhook_url": "webhookUrl",
}
_NODE_SNAKE = {"node_id": "nodeId", "field_name": "fieldName", "field_value": "fieldValue"}


def camel_case(fields: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """``fields`` with each snake_case name of ``names`` renamed to its camelCase; both
    spellings of one field with different values is :class:`BadBody`."""
    out = {k: v for k, v in fields.items() if k not in names}
    for snake, camel in names.items():
        if snake not in fields:
            continue
        if camel in fields and fields[camel] != fields[snake]:
            raise BadBody(f"{snake} and {camel} differ: send one of them")
        out[camel] = fields[snake]
    return out


def task_payload(body: Any) -> dict[str, Any]:
    """The payload to queue: the create body minus ``apiKey``, once known to be runnable;
    snake_case field names (``workflow_id``, ``node_info_list``) are read as camelCase."""
    if not isinstance(body, dict):
        raise BadBody("body must be a JSON object")
    payload = camel_case({k: v for k, v in body.items() if k != "apiKey"}, _SNAKE)
    nodes = payload.get("nodeInfoList")
    if isinstance(nodes, list):
        payload["nodeInfoList"] = [
            camel_case(n, _NODE_SNAKE) if isinstance(n, dict) else n for n in nodes
        ]
    hook = payload.get("webhookUrl")
    if hook is not None and not (
        isinstance(hook, str) and hook.startswith(("http://", "https://"))
    ):
        raise BadBody("webhookUrl: must be an http(s) URL")
    workflow_id = payload.get("workflowId")
    try:
        TaskAssignData.model_validate(
            {
                "workflowId": None if workflow_id in (None, "") else str(workflow_id),
                "nodeInfoList": payload.get("nodeInfoList") or [],
                "webhookUrl": "http://check",
                "workflow": payload.get("workflow"),
            }
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        raise BadBody(f"{field}: {first['msg']}") from exc
    return payload


def status_of(task: Task) -> str:
    """RunningHub's ``/status`` value: QUEUED, RUNNING, SUCCESS or FAILED."""
    return _STATUS.get(task.state, "FAILED")


def outputs_body(task: Task) -> dict[str, Any]:
    """RunningHub's ``/outputs`` answer for ``task`` (also a TASK_END's ``eventData``)."""
    if task.state is TaskState.PENDING:
        return dict(QUEUED)
    if not task.state.terminal:
        return dict(RUNNING)
    if task.state is TaskState.SUCCESS:
        result = task.result if isinstance(task.result, dict) else {}
        return {"code": 0, "msg": "success", "data": result.get("data") or []}
    error = task.error or {}
    detail = error.get("detail")
    reason = detail if isinstance(detail, dict) and "exception_message" in detail else None
    reason = reason or {
        "exception_type": str(error.get("code") or task.state),
        "exception_message": str(error.get("message") or f"task {task.state}"),
    }
    return {"code": TASK_FAILED[0], "msg": TASK_FAILED[1], "data": {"failedReason": reason}}


def task_end(task: Task) -> bytes:
    """The ``TASK_END`` webhook body RunningHub would send for ``task``."""
    event_data = orjson.dumps(outputs_body(task)).decode()
    return orjson.dumps({"event": "TASK_END", "taskId": task.task_id, "eventData": event_data})
