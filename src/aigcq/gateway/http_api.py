"""The HTTP API (OpenAPI at ``/docs``): submit, inspect, cancel, queues, workflows."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from aigcq.domain import ErrorCode
from aigcq.gateway.auth import bearer, token_owner
from aigcq.gateway.errors import ClientError
from aigcq.gateway.service import Gateway
from aigcq.gateway.submission import MAX_BACKEND_ID, parse_generate
from aigcq.plumbing.http_body import BodyTooLarge, Disconnected, request_body

Authorization = Annotated[str | None, Header()]

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


def api_router(gw: Gateway) -> APIRouter:
    router = APIRouter(prefix="/api", tags=["api"])

    def client_of(authorization: str | None) -> dict[str, Any]:
        claims = gw.auth.client(bearer(authorization))
        if claims is None:
            raise ClientError(ErrorCode.AUTH, "invalid or missing bearer token")
        return claims

    def require_admin(authorization: str | None) -> None:
        if not gw.auth.admin(bearer(authorization)):
            raise ClientError(ErrorCode.AUTH, "admin token required")

    @router.post("/tasks", status_code=202, summary="Submit a task")
    async def submit(request: Request, authorization: Authorization = None) -> dict[str, Any]:
        claims = client_of(authorization)  # before a byte of the body is read
        data = await json_object(request, gw.settings.max_payload_bytes)
        req = parse_generate(data)
        backend_id = data.get("backendId") or claims.get("sub") or ""
        if not isinstance(backend_id, str) or len(backend_id) > MAX_BACKEND_ID:
            raise ClientError(
                ErrorCode.JSON, f"backendId: a string of at most {MAX_BACKEND_ID} characters"
            )
        if backend_id and not gw.auth.may_use_id(claims, backend_id):
            raise ClientError(ErrorCode.AUTH, f"this token may not use backendId {backend_id!r}")
        created = await gw.submission.submit(req, backend_id, deliver=bool(backend_id))
        return {
            "taskId": req.taskId,
            "duplicate": not created,
            "code": "AssessmentSuccess",
            "msg": gw.messages.get("AssessmentSuccess"),
        }

    @router.get("/tasks", summary="Recently finished tasks, newest first")
    async def recent_tasks(
        limit: int = 20, authorization: Authorization = None
    ) -> list[dict[str, Any]]:
        client_of(authorization)
        return [
            {
                "taskId": t.task_id,
                "state": t.state.value,
                "platform": t.platform,
                "AIGC": t.aigc,
                "target": t.target,
                "attempt": t.attempt,
                "seconds": round(t.updated_at - t.created_at, 3),
            }
            for t in await gw.rt.store.recent(min(limit, 1000))
        ]

    @router.get("/tasks/{task_id}", summary="A task's state, timeline and result")
    async def get_task(task_id: str, authorization: Authorization = None) -> dict[str, Any]:
        # Any client may read any task: one backend's token serves several connection ids.
        client_of(authorization)
        task = await gw.owned_task(task_id, None)
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
            "timeline": await gw.rt.store.timeline(task_id),
        }

    @router.post("/tasks/{task_id}/cancel", summary="Cancel a live task")
    async def cancel(task_id: str, authorization: Authorization = None) -> dict[str, Any]:
        owner = token_owner(client_of(authorization))
        return {"taskId": task_id, "state": await gw.cancel(task_id, owner)}

    @router.get("/queues", summary="Waiting, in flight and capacity per queue")
    async def queues(authorization: Authorization = None) -> list[dict[str, Any]]:
        client_of(authorization)
        return await queue_overview(gw)

    @router.put(
        "/workflows/{workflow_id}",
        summary="Store an API-format ComfyUI workflow",
        openapi_extra=JSON_OBJECT_BODY,
    )
    async def put_workflow(
        workflow_id: str, request: Request, authorization: Authorization = None
    ) -> dict[str, Any]:
        require_admin(authorization)  # before a byte of the body is read
        workflow = await json_object(request, gw.settings.max_payload_bytes)
        await gw.rt.redis.set(gw.rt.store.keys.workflow(workflow_id), orjson.dumps(workflow))
        return {"workflowId": workflow_id, "nodes": len(workflow)}

    @router.get("/workflows/{workflow_id}", summary="Fetch a stored workflow (bridges)")
    async def get_workflow(workflow_id: str, authorization: Authorization = None) -> Response:
        if not gw.auth.bridge(bearer(authorization)):
            raise ClientError(ErrorCode.AUTH, "bridge or admin token required")
        raw = await gw.rt.redis.get(gw.rt.store.keys.workflow(workflow_id))
        if raw is None:
            raise ClientError(ErrorCode.NOT_FOUND, f"no workflow {workflow_id!r}")
        return Response(raw, media_type="application/json")

    return router


async def queue_overview(gw: Gateway) -> list[dict[str, Any]]:
    rt = gw.rt
    keys = rt.store.keys
    rows: list[dict[str, Any]] = []
    pipe = rt.redis.pipeline(transaction=False)
    queues = rt.config.queues()
    targets: list[str] = []
    for aigc, platform in queues:
        ext = rt.platforms.adapter_for(platform)
        targets.append(ext.name if ext else "")
        pipe.llen(keys.wait(aigc, platform))
        pipe.zcard(keys.running(aigc, targets[-1] or "-"))
    counts = await pipe.execute()
    for i, (aigc, platform) in enumerate(queues):
        account = rt.config.account(aigc, platform)
        rows.append(
            {
                "AIGC": aigc,
                "platform": platform,
                "waiting": int(counts[2 * i]),
                "inFlight": {targets[i]: int(counts[2 * i + 1])} if targets[i] else {},
                "capacity": {targets[i]: account.concurrency if account else 0},
            }
        )
    return rows


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
    async def handle(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ClientError)
        return JSONResponse(exc.body(gw.messages), status_code=exc.status)

    return handle
