"""The HTTP API (OpenAPI at ``/docs``): submit, inspect, cancel, queues, workflows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from aigcq.domain import ErrorCode, TaskState
from aigcq.gateway.errors import ClientError, as_client_error, error_responses
from aigcq.gateway.gateway import Gateway
from aigcq.gateway.queue_view import InternalCapacity, queue_rows
from aigcq.gateway.submission import MAX_BACKEND_ID, parse_generate
from aigcq.observability import tracing
from aigcq.plumbing.asgi_body import request_body
from aigcq.plumbing.auth import ADMIN_TOKEN_HINT, BRIDGE_TOKEN_HINT, Principal, bearer
from aigcq.plumbing.http_body import BodyTooLarge, Disconnected
from aigcq.scheduler.estimates import UNKNOWN

Authorization = Annotated[str | None, Header()]

#: how many finished tasks ``GET /api/tasks`` looks through (finish.lua keeps that many)
RECENT_KEPT = 1000

#: the Bearer tokens of the OpenAPI document (``securitySchemes``: aigcq.serve.api_description)
CLIENT_TOKEN, ADMIN_TOKEN, BRIDGE_TOKEN = "clientToken", "adminToken", "bridgeToken"


def takes(*tokens: str) -> dict[str, Any]:
    """OpenAPI for a route that takes any one of ``tokens`` (without: by its path, a client
    token or the admin token; ``/api/admin/…`` the admin token)."""
    return {"security": [{token: []} for token in tokens]}


#: OpenAPI for a route that reads its JSON object body itself (after its auth check)
JSON_OBJECT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}


class SubmitBody(BaseModel):
    taskId: str
    platform: str
    payload: dict[str, Any]
    AIGC: str | None = None
    backendId: str | None = None
    maxCost: float | None = None
    priority: float | None = None
    userId: str | None = None
    maxWaitMs: int | None = None
    keepWaiting: bool | None = None


#: POST /api/tasks reads its body itself (size limit first, then JSON): its schema here.
SUBMIT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": SubmitBody.model_json_schema()}},
    }
}


def api_router(
    gw: Gateway, internal: Callable[[], InternalCapacity | None] = lambda: None
) -> APIRouter:
    """``internal``: the internal target's capacity now (None: this process has none)."""
    router = APIRouter(prefix="/api", tags=["api"])
    _task_routes(router, gw, internal)
    _workflow_routes(router, gw)
    return router


def _client(gw: Gateway, authorization: str | None) -> Principal:
    token = bearer(authorization)
    principal = gw.auth.client(token)
    if principal is None:
        why = gw.auth.refusal(token, "invalid or missing token (Authorization: Bearer)")
        raise ClientError(ErrorCode.AUTH, why)
    return principal


def _backend_id(gw: Gateway, principal: Principal, data: dict[str, Any]) -> str:
    """Whom a submitted task's results go to: the body's ``backendId``, else the token's
    (its ``sub``, the name it is known by)."""
    backend_id = data.get("backendId") or principal.sub
    if not isinstance(backend_id, str) or len(backend_id) > MAX_BACKEND_ID:
        raise ClientError(
            ErrorCode.JSON, f"backendId: a string of at most {MAX_BACKEND_ID} characters"
        )
    if backend_id and not principal.may_use(backend_id):
        raise ClientError(ErrorCode.AUTH, gw.auth.id_refusal(principal, "backendId", backend_id))
    return backend_id


def _task_routes(
    router: APIRouter, gw: Gateway, internal: Callable[[], InternalCapacity | None]
) -> None:
    def client_of(authorization: str | None) -> Principal:
        return _client(gw, authorization)

    @router.post(
        "/tasks",
        status_code=202,
        summary="Submit a task",
        openapi_extra=SUBMIT_BODY,
        responses=error_responses(
            ErrorCode.JSON, ErrorCode.AUTH, ErrorCode.BALANCE, ErrorCode.CONFLICT,
            ErrorCode.PAYLOAD_TOO_LARGE, ErrorCode.PLATFORM, ErrorCode.ASSESSMENT,
        ),
    )  # fmt: skip
    async def submit(request: Request, authorization: Authorization = None) -> dict[str, Any]:
        principal = client_of(authorization)  # before a byte of the body is read
        data = await json_object(request, gw.settings.max_payload_bytes)
        req = parse_generate(data)
        req.traceparent = req.traceparent or request.headers.get("traceparent")
        backend_id = _backend_id(gw, principal, data)
        created = await gw.submission.submit(
            req, backend_id, deliver=bool(backend_id), principal=principal.name
        )
        return {
            "taskId": req.taskId,
            "duplicate": not created,
            "code": "AssessmentSuccess",
            "msg": gw.messages.get("AssessmentSuccess"),
            **gw.estimate(req, created),
        }

    @router.get(
        "/tasks",
        summary="Recently finished tasks of the token's ids, newest first",
        responses=error_responses(ErrorCode.JSON, ErrorCode.AUTH),
    )
    async def recent_tasks(
        limit: int = 20, authorization: Authorization = None
    ) -> list[dict[str, Any]]:
        principal = client_of(authorization)
        limit = max(0, min(limit, RECENT_KEPT))
        # the token's own among the last RECENT_KEPT (all it keeps): one pipelined read
        recent = await gw.rt.store.reads.recent(limit if principal.ids is None else RECENT_KEPT)
        return [
            {
                "taskId": t.task_id,
                "state": t.state.value,
                "platform": t.platform,
                "AIGC": t.aigc,
                "target": t.target,
                "attempt": t.attempt,
                "seconds": round(t.updated_at - t.created_at, 3),
                "failure": t.failure,
            }
            for t in [t for t in recent if principal.reads(t.backend_id)][:limit]
        ]

    @router.get(
        "/tasks/{task_id}",
        summary="A task's state, timeline and result",
        responses=error_responses(ErrorCode.AUTH, ErrorCode.NOT_FOUND),
    )
    async def get_task(task_id: str, authorization: Authorization = None) -> dict[str, Any]:
        # a client token reads the tasks of the ids it names (someone else's: TaskNotFound)
        task = await gw.owned_task(task_id, client_of(authorization).ids)
        waiting = task.state is TaskState.PENDING
        queue = (task.aigc, task.platform)
        return {
            "taskId": task.task_id,
            "state": task.state.value,
            "platform": task.platform,
            "AIGC": task.aigc,
            "backendId": task.backend_id,
            "attempt": task.attempt,
            "target": task.target,
            "remoteTaskId": task.remote_id,
            "result": task.result,
            "error": task.error,
            "failure": task.failure,  # the error's class, code and message, as shown
            "timeline": await gw.rt.store.reads.timeline(task_id),
            # its OpenTelemetry trace's id (null: not traced; docs/tracing.md)
            "traceId": _trace_id(task.trace),
            # where it stands while it waits (both null otherwise): docs/client-protocol.md
            **(await gw.queue_updates.waiting(task_id, queue) if waiting else UNKNOWN.wire(0)),
        }

    @router.post(
        "/tasks/{task_id}/cancel",
        summary="Cancel a live task",
        responses=error_responses(ErrorCode.AUTH, ErrorCode.NOT_FOUND, ErrorCode.GONE),
    )
    async def cancel(task_id: str, authorization: Authorization = None) -> dict[str, Any]:
        owners = client_of(authorization).ids
        return {"taskId": task_id, "state": await gw.cancel(task_id, owners)}

    @router.get(
        "/queues",
        summary="Waiting, in flight and capacity per queue",
        responses=error_responses(ErrorCode.AUTH),
    )
    async def queues(authorization: Authorization = None) -> list[dict[str, Any]]:
        client_of(authorization)
        return await queue_rows(gw.rt, internal())


def require_admin(gw: Gateway, authorization: str | None) -> None:
    if not gw.auth.admin(bearer(authorization)):
        raise ClientError(ErrorCode.AUTH, f"admin token required: {ADMIN_TOKEN_HINT}")


def _workflow_routes(router: APIRouter, gw: Gateway) -> None:
    @router.put(
        "/workflows/{workflow_id}",
        summary="Store an API-format ComfyUI workflow",
        responses=error_responses(ErrorCode.JSON, ErrorCode.AUTH),
        openapi_extra={**JSON_OBJECT_BODY, **takes(ADMIN_TOKEN)},
    )
    async def put_workflow(
        workflow_id: str, request: Request, authorization: Authorization = None
    ) -> dict[str, Any]:
        require_admin(gw, authorization)  # before a byte of the body is read
        workflow = await json_object(request, gw.settings.max_payload_bytes)
        await gw.rt.redis.set(gw.rt.store.keys.workflow(workflow_id), orjson.dumps(workflow))
        return {"workflowId": workflow_id, "nodes": len(workflow)}

    @router.get(
        "/workflows/{workflow_id}",
        summary="Fetch a stored workflow (bridges)",
        responses=error_responses(ErrorCode.AUTH, ErrorCode.NOT_FOUND),
        openapi_extra=takes(BRIDGE_TOKEN, ADMIN_TOKEN),
    )
    async def get_workflow(workflow_id: str, authorization: Authorization = None) -> Response:
        if not gw.auth.bridge(bearer(authorization)):
            why = f"bridge or admin token required: {BRIDGE_TOKEN_HINT}"
            raise ClientError(ErrorCode.AUTH, why)
        raw = await gw.rt.redis.get(gw.rt.store.keys.workflow(workflow_id))
        if raw is None:
            raise ClientError(ErrorCode.NOT_FOUND, f"no workflow {workflow_id!r}")
        return Response(raw, media_type="application/json")


async def bounded_body(request: Request, limit: int) -> bytes:
    """The request body, of at most ``limit`` bytes (else PayloadTooLarge, 413)."""
    try:
        return await request_body(request, limit)
    except BodyTooLarge as exc:
        raise ClientError(ErrorCode.PAYLOAD_TOO_LARGE, str(exc)) from exc
    except Disconnected as exc:
        raise ClientError(ErrorCode.JSON, "the request body did not arrive") from exc


async def json_object(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object body, read with a limit (a larger body is refused as soon
    as it passes ``limit``, never buffered whole)."""
    raw = await bounded_body(request, limit)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ClientError(ErrorCode.JSON, f"malformed JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ClientError(ErrorCode.JSON, "body must be an object")
    return data


def client_error_handler(gw: Gateway) -> Any:
    """Answers :class:`ClientError` and FastAPI's validation errors (as ``JSONError``)."""

    async def handle(_request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, RequestValidationError):
            exc = as_client_error(exc)
        assert isinstance(exc, ClientError)
        return JSONResponse(exc.body(gw.messages), status_code=exc.status)

    return handle


def _trace_id(traceparent: str) -> str | None:
    """The task's trace id, when its trace is recorded (sampled); None otherwise."""
    found = tracing.parse(traceparent)
    return f"{found[0]:032x}" if found and found[2] & 1 else None
