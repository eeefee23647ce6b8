"""What serve's ``/openapi.json`` (and so ``/docs``) adds to FastAPI's own description:

* who may call: the client and admin Bearer tokens as ``securitySchemes``, so ``/docs``
  has an Authorize button, and each route names the tokens it takes (the ``Authorization``
  header parameters FastAPI lists are dropped: OpenAPI ignores them, and the button sets
  the header);
* the routes FastAPI does not describe: the TASK_END callbacks (plain ASGI routes) and the
  WebSocket endpoints. OpenAPI has no WebSocket operations, so each is a ``GET`` (the
  upgrade request) whose description says what to open it with and where its messages are
  documented."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIWebSocketRoute

from aigcq.domain import ErrorCode
from aigcq.gateway.errors import HTTP_STATUS
from aigcq.gateway.http_api import ADMIN_TOKEN as ADMIN
from aigcq.gateway.http_api import BRIDGE_TOKEN as BRIDGE
from aigcq.gateway.http_api import CLIENT_TOKEN as CLIENT

SCHEMES: dict[str, dict[str, Any]] = {
    CLIENT: {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT",
        "description": "A client token: a JWT signed with TOKEN_SECRET (`aigcq token ID` "
        "prints one, valid 24 h), one of AIGCQ_CLIENT_TOKENS, or the admin token.",
    },
    ADMIN: {
        "type": "http",
        "scheme": "bearer",
        "description": "The admin token (AIGCQ_ADMIN_TOKEN; `aigcq up` keeps it in "
        ".aigcq/secrets.json and puts it in its dashboard link).",
    },
    BRIDGE: {
        "type": "http",
        "scheme": "bearer",
        "description": "The bridge token (AIGCQ_BRIDGE_TOKEN), for the bridges' /ws.",
    },
}
WEBSOCKET_TAG = "websocket"


def _query(name: str, description: str, *, required: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "schema": {"type": "string"},
        "description": description,
    }


def _errors(*codes: ErrorCode) -> dict[str, Any]:
    """Answers with aigcq's error body, by status, each described by its codes."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(HTTP_STATUS.get(code, 400), []).append(code.value)
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    return {
        str(status): {"description": " / ".join(names), "content": body}
        for status, names in sorted(by_status.items())
    }


_TASK_END_BODY = {
    "type": "object",
    "required": ["event", "taskId", "eventData"],
    "properties": {
        "event": {"const": "TASK_END"},
        "taskId": {"type": "string", "description": "The sender's id for the run"},
        "eventData": {
            "type": "string",
            "description": 'JSON text: {"code": 0, "msg", "data": [{"fileUrl", "fileType", '
            '"nodeId", ...}]} on success, a non-zero code and msg on failure',
        },
    },
}
_CALLBACK_ERRORS = (
    ErrorCode.JSON,
    ErrorCode.SIGNATURE,
    ErrorCode.NOT_FOUND,
    ErrorCode.GONE,
    ErrorCode.PAYLOAD_TOO_LARGE,
    ErrorCode.ASSESSMENT,
)
_CALLBACK = {
    "tags": ["callbacks"],
    "summary": "TASK_END webhook of a bridge, the message-dispatcher or RunningHub",
    "description": "Only at the URL aigcq handed out with the task (its query is signed). "
    "A repeat of the TASK_END that ended the task answers 200 `already recorded`. "
    "Served on every port of the server; the URLs handed out use AIGCQ_CALLBACK_URL, else "
    "AIGCQ_CALLBACK_PORT. See docs/client-protocol.md, Callbacks.",
    "parameters": [
        _query("t", "taskId", required=True),
        _query("a", "attempt (1-9 digits)", required=True),
        _query("s", "HMAC of taskId and attempt", required=True),
        _query("k", "1: the result's files may be copied before the answer (result custody)"),
    ],
    "requestBody": {"required": True, "content": {"application/json": {"schema": _TASK_END_BODY}}},
    "responses": {
        "200": {"description": "recorded (`success`), `noted`, or `already recorded`"},
        **_errors(*_CALLBACK_ERRORS),
    },
}
_CLIENT_SOCKET = {
    "summary": "WebSocket: business backends (the original system's client protocol)",
    "description": "Open with a WebSocket client: ws://HOST:PORT/?token=<client token>"
    "&id=<backendId>. Messages are JSON objects: generate, ack, cancel, ping from the "
    "client; submitted, result, progress, QUEUE_UPDATE, cancelled, error, pong from the "
    "server. A bad token closes with 4401. See docs/client-protocol.md, WebSocket.",
    "parameters": [
        _query("token", "a client token (or Authorization: Bearer)", required=True),
        _query("id", "the backendId results are delivered to", required=True),
        _query("ack", "1: results are kept until acknowledged"),
        _query("progress", "1: also send live progress messages"),
        _query("queue", "0: send no QUEUE_UPDATE messages (a waiting task's position and ETA)"),
    ],
}
_BRIDGE_SOCKET = {
    "summary": "WebSocket: bridges in front of ComfyUI instances (the bridge protocol)",
    "description": "Open with a WebSocket client: ws://HOST:PORT/ws?token=<bridge token> "
    "(or Authorization: Bearer, or REGISTER's data.token). REGISTER, PING, TASK_ACK, "
    "PROGRESS, CAPACITY from the bridge; TASK_ASSIGN, CANCEL, PONG from the hub; results "
    "come back as TASK_END over HTTP. See docs/bridge-protocol.md.",
    "parameters": [_query("token", "the bridge token")],
    "security": [{BRIDGE: []}, {}],
}
SOCKETS: dict[str, dict[str, Any]] = {
    "/": _CLIENT_SOCKET,
    "/client": _CLIENT_SOCKET,
    "/ws": _BRIDGE_SOCKET,
}


def _socket_operation(path: str) -> dict[str, Any]:
    described = SOCKETS.get(path) or {
        "summary": "WebSocket",
        "description": "Open with a WebSocket client; see docs/topologies.md.",
    }
    return {
        "tags": [WEBSOCKET_TAG],
        **described,
        "responses": {"101": {"description": "Switching Protocols: the WebSocket is open"}},
    }


def _secure(paths: dict[str, Any]) -> None:
    """Each operation that reads an ``Authorization`` header names its tokens instead: as
    it declares (``http_api.takes``), else by its path."""
    for path, operations in paths.items():
        for operation in operations.values():
            params = operation.get("parameters", [])
            kept = [p for p in params if not (p["in"] == "header" and p["name"] == "authorization")]
            if len(kept) == len(params):
                continue
            operation["parameters"] = kept
            admin_only = path.startswith("/api/admin/")
            default: list[dict[str, list[str]]] = (
                [{ADMIN: []}] if admin_only else [{CLIENT: []}, {ADMIN: []}]
            )
            operation.setdefault("security", default)
            if not kept:
                del operation["parameters"]


def describe_serve(app: FastAPI) -> None:
    """``app``'s OpenAPI document with the tokens, the callbacks and its WebSockets."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()  # also cached in app.openapi_schema
            paths = schema.setdefault("paths", {})
            _secure(paths)
            schema.setdefault("components", {})["securitySchemes"] = SCHEMES
            for path in ("/callback/all", "/callback"):
                paths.setdefault(path, {"post": _CALLBACK})
            for path in websocket_paths(app.routes):
                paths.setdefault(path, {})["get"] = _socket_operation(path)
        return app.openapi_schema or build()

    app.openapi = openapi  # type: ignore[method-assign]


def websocket_paths(routes: Iterable[Any]) -> list[str]:
    return [route.path for route in routes if isinstance(route, APIWebSocketRoute)]
