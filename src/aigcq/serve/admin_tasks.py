"""The operator's task list: ``GET /api/admin/tasks``, filtered by state, project (AIGC),
platform, client, target and time of last change, a page at a time (admin token). The
controls on one task (cancel, retry) are in :mod:`aigcq.gateway.http_api` and
:mod:`aigcq.serve.admin_api`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query

from aigcq.domain import ErrorCode, states_named
from aigcq.gateway.errors import ClientError, error_responses
from aigcq.gateway.gateway import Gateway
from aigcq.gateway.http_api import require_admin
from aigcq.queue.listing import ANY_STATE, TaskFilter, find_tasks
from aigcq.serve.admin_api import task_row

Authorization = Annotated[str | None, Header()]
MAX_PAGE = 1000


def admin_tasks_router(gw: Gateway) -> APIRouter:
    router = APIRouter(tags=["admin"])

    @router.get(
        "/api/admin/tasks",
        summary="Tasks by filter, the latest to change first, a page at a time",
        responses=error_responses(ErrorCode.JSON, ErrorCode.AUTH),
    )
    async def list_tasks(
        state: Annotated[str, Query(description="States, comma-separated; live, finished")] = "",
        aigc: Annotated[str, Query(description="AIGC project")] = "",
        platform: str = "",
        client: Annotated[str, Query(description="The client's backendId")] = "",
        target: Annotated[str, Query(description="Where it ran: bridge, runninghub...")] = "",
        since: Annotated[float, Query(description="Last change at or after (epoch s)")] = 0.0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        offset: Annotated[int, Query(ge=0)] = 0,
        authorization: Authorization = None,
    ) -> dict[str, Any]:
        require_admin(gw, authorization)
        try:
            states = states_named(state)
        except ValueError as exc:
            raise ClientError(ErrorCode.JSON, f"state: {exc}") from exc
        wanted = TaskFilter(states or ANY_STATE, aigc, platform, client, target, since)
        tasks = (await find_tasks(gw.rt.store, wanted))[::-1]  # the latest to change first
        page = tasks[offset : offset + limit]
        return {
            "total": len(tasks),
            "offset": offset,
            "limit": limit,
            "tasks": [{**task_row(t), "created": t.created_at} for t in page],
        }

    return router
