"""The message-dispatcher's own routes in its ``/openapi.json`` (they are plain Starlette
routes, which FastAPI does not describe): request bodies and every answer they give."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

_STR = {"type": "string"}
_NODE = {
    "type": "object",
    "required": ["nodeId", "fieldName", "fieldValue"],
    "properties": {"nodeId": _STR, "fieldName": _STR, "fieldValue": {}},
}
_TASK = {
    "type": "object",
    "description": "RunningHub's create body; snake_case names (workflow_id, node_info_list,"
    " node_id...) are read as the same fields.",
    "properties": {
        "apiKey": {**_STR, "description": "The JWT from /api/auth/login"},
        "workflowId": _STR,
        "nodeInfoList": {"type": "array", "items": _NODE},
        "workflow": {"type": "object", "description": "An API-format workflow, instead"},
        "webhookUrl": {**_STR, "description": "TASK_END is POSTed here (http/https)"},
    },
}
_LOOKUP = {
    "type": "object",
    "required": ["apiKey", "taskId"],
    "properties": {"apiKey": _STR, "taskId": _STR},
}
_LOGIN = {
    "type": "object",
    "required": ["username", "password"],
    "properties": {"username": _STR, "password": _STR},
}
_MD_OK = {"type": "object", "properties": {"success": {"const": True}, "data": {}}}
_MD_ERROR = {
    "type": "object",
    "properties": {
        "success": {"const": False},
        "error": {"type": "object", "properties": {"code": _STR, "message": _STR}},
    },
}
_RH = {
    "type": "object",
    "description": "RunningHub's envelope; errors are HTTP 200 with a code: 301"
    " PARAMS_INVALID, 802 APIKEY_UNAUTHORIZED, 807 APIKEY_TASK_NOT_FOUND, 421"
    " TASK_QUEUE_MAXED.",
    "properties": {"code": {"type": "integer"}, "msg": _STR, "data": {}},
}


def _answer(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _operation(
    summary: str, body: dict[str, Any] | None, answers: dict[str, dict[str, Any]], tag: str
) -> dict[str, Any]:
    op: dict[str, Any] = {"tags": [tag], "summary": summary, "responses": answers}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


_MD = "message-dispatcher"
_RHC = "RunningHub-compatible"
_RH_OK = {"200": _answer(_RH, "code 0 and data, or an error code")}
PATHS: dict[str, dict[str, Any]] = {
    "/api/auth/login": {
        "post": _operation(
            "Log in: a JWT for /api/task, /api/overview and the RunningHub routes",
            _LOGIN,
            {
                "200": _answer(_MD_OK, "{access_token, expires_in, expires_at}"),
                "400": _answer(_MD_ERROR, "InvalidBody"),
                "401": _answer(_MD_ERROR, "Unauthorized: wrong username or password"),
            },
            _MD,
        )
    },
    "/api/task": {
        "post": _operation(
            "Queue a task for the bridges (apiKey in the body or Authorization: Bearer)",
            _TASK,
            {
                "200": _answer(_MD_OK, "{requestId, taskId}"),
                "400": _answer(_MD_ERROR, "InvalidBody: the field and the problem"),
                "401": _answer(_MD_ERROR, "Unauthorized: missing, invalid or expired token"),
            },
            _MD,
        )
    },
    "/api/health": {
        "get": _operation(
            "Bridges, instances, free slots and health (no token)",
            None,
            {"200": _answer(_MD_OK, "{healthy, status, bridges, instances, freeSlots}")},
            _MD,
        )
    },
    "/api/overview": {
        "get": _operation(
            "Capacity, bridges, queues and recent tasks (Authorization: Bearer <JWT>)",
            None,
            {
                "200": _answer(_MD_OK, "capacity, bridgeList, queues, recentTasks"),
                "401": _answer(_MD_ERROR, "Unauthorized"),
            },
            _MD,
        )
    },
    "/task/openapi/create": {"post": _operation("Create a task", _TASK, _RH_OK, _RHC)},
    "/task/openapi/status": {"post": _operation("A task's status", _LOOKUP, _RH_OK, _RHC)},
    "/task/openapi/outputs": {"post": _operation("A task's outputs", _LOOKUP, _RH_OK, _RHC)},
    "/task/openapi/cancel": {"post": _operation("Cancel a task", _LOOKUP, _RH_OK, _RHC)},
    "/uc/openapi/accountStatus": {
        "post": _operation(
            "Tasks in flight ({apikey} or {apiKey}: the JWT)",
            {"type": "object", "properties": {"apikey": _STR, "apiKey": _STR}},
            _RH_OK,
            _RHC,
        )
    },
}


def describe_dispatcher(app: FastAPI) -> None:
    """``app``'s OpenAPI document names the dispatcher and describes its routes."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()  # also cached in app.openapi_schema
            schema["info"]["title"] = "aigcq message-dispatcher"
            schema["info"]["summary"] = (
                "The GPU front of the original system: JWT API, RunningHub-compatible"
                " routes, bridges at /ws; the queue's own /api routes answer here too."
            )
            schema["paths"] = {**PATHS, **schema.get("paths", {})}
        return app.openapi_schema or build()

    app.openapi = openapi  # type: ignore[method-assign]
