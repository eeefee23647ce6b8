"""The OpenAPI document (``/openapi.json``, ``/docs``): request bodies and error replies.

The routes read their bodies themselves (:func:`aigcq.asynch.http.parse_body`, for the
error replies and the Go-compatible decoding), so FastAPI cannot see them; this adds each
body's schema, the envelope of every reply and the errors each route can answer.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from aigcq.asynch.errors import NUMBER, OK, STATUS, Code
from aigcq.asynch.schemas import (
    AutoTune,
    ModelCreate,
    ModelRef,
    ModelTypeCreate,
    ModelTypeRef,
    ModelTypeUpdate,
    ModelUpdate,
    RunWork,
    TaskBatch,
    TaskCreate,
)

BODIES: dict[str, type[BaseModel]] = {
    "/model/createModel": ModelCreate,
    "/model/updateModel": ModelUpdate,
    "/model/deleteModel": ModelRef,
    "/model/type/createModelType": ModelTypeCreate,
    "/model/type/updateModelType": ModelTypeUpdate,
    "/model/type/deleteModelType": ModelTypeRef,
    "/model/autoTune": AutoTune,
    "/task/createTask": TaskCreate,
    "/task/getTaskBatch": TaskBatch,
    "/task/runWork": RunWork,
}
_ENVELOPE = {
    "type": "object",
    "required": ["code", "message", "data"],
    "properties": {
        "code": {"type": "integer", "example": OK, "description": "0: success."},
        "message": {"type": "string", "example": "success"},
        "data": {},
    },
}
_ERROR = {
    "type": "object",
    "required": ["code", "reason", "message", "data"],
    "properties": {
        "code": {
            "type": "integer",
            "enum": sorted(set(NUMBER.values())),
            "description": "GoFrame's gcode number of the refusal's class (never 0).",
        },
        "reason": {"type": "string", "enum": [c.value for c in Code]},
        "message": {"type": "string", "description": "What is wrong (the first bad field)."},
        "data": {"type": "null"},
    },
}
_ALWAYS = (Code.INVALID_ARGUMENT, Code.UNAVAILABLE, Code.INTERNAL_ERROR)
_MANAGEMENT = (Code.UNAUTHORIZED,)


def _errors(path: str) -> dict[str, Any]:
    codes = list(_ALWAYS)
    if path.startswith("/model/") or path in ("/task/runWork", "/task/cleanWork"):
        codes += _MANAGEMENT
    if path in BODIES:
        codes.append(Code.PAYLOAD_TOO_LARGE)
    if path.startswith("/model/"):
        codes += [Code.MODEL_NOT_FOUND, Code.MODEL_EXISTS, Code.MODEL_BUSY]
        codes += [Code.MODEL_TYPE_NOT_FOUND, Code.MODEL_TYPE_EXISTS, Code.MODEL_HOST_NOT_ALLOWED]
        codes += [Code.INVALID_HEAD_MSG, Code.PROMPTS_CORE_SYNC_FAILED]
    if path.startswith("/task/"):
        codes += [Code.MODEL_NOT_FOUND, Code.MODEL_DISABLED, Code.QUEUE_FULL]
        codes += [Code.TASK_NOT_FOUND, Code.INVALID_HEAD_MSG]
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(STATUS[code], []).append(code.value)
    return {
        str(status): {
            "description": ", ".join(sorted(set(names))),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            **(
                {"headers": {"Retry-After": {"schema": {"type": "integer"}}}}
                if status == 503
                else {}
            ),
        }
        for status, names in sorted(by_status.items())
    }


def document(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["Envelope"] = _ENVELOPE
        components["Error"] = _ERROR
        for path, methods in schema.get("paths", {}).items():
            for method, operation in methods.items():
                if method not in ("get", "post"):
                    continue
                if method == "post" and path in BODIES:
                    model = BODIES[path]
                    body = model.model_json_schema(
                        by_alias=True, ref_template="#/components/schemas/{model}"
                    )
                    components.update(body.pop("$defs", {}))
                    components[model.__name__] = body
                    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
                    operation["requestBody"] = {
                        "required": True,
                        "content": {"application/json": {"schema": ref}},
                    }
                if path.startswith(("/model/", "/task/")):
                    ok = {"application/json": {"schema": {"$ref": "#/components/schemas/Envelope"}}}
                    operation["responses"] = {
                        "200": {"description": "success", "content": ok},
                        **_errors(path),
                    }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
