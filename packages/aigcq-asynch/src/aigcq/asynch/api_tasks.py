"""Task endpoints: createTask, getTaskResult, getTaskBatch, runWork, cleanWork.

Task fields are returned in the seed's snake_case (``task_id``, ``state``, ``oss_file`` …).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Query, Request, Response

from aigcq.asynch.errors import AsynchError, Code
from aigcq.asynch.http import parse_body, reply, require_admin, service
from aigcq.asynch.identity import identity_from
from aigcq.asynch.schemas import RunWork, TaskBatch, TaskCreate
from aigcq.asynch.states import State
from aigcq.asynch.submit import create_task

router = APIRouter(prefix="/task")


@router.post("/createTask")
async def create_task_route(request: Request) -> Response:
    body = await parse_body(request, TaskCreate)
    task_id = await create_task(service(request), body, identity_from(request.headers))
    return reply({"task_id": task_id})


@router.get("/getTaskResult")
async def get_task_result(
    request: Request, task_id: str = Query(alias="taskId", min_length=1, max_length=64)
) -> Response:
    row = await service(request).tasks.get(task_id)
    if row is None:
        raise AsynchError(Code.TASK_NOT_FOUND, f"task {task_id!r} does not exist")
    return reply(row)


@router.post("/getTaskBatch")
async def get_task_batch(request: Request) -> Response:
    """``data``: the rows of the known ids in the order asked (successful ones move 2 → 4),
    as the seed's list; the ids that do not exist beside it, in ``not_found``."""
    body = await parse_body(request, TaskBatch)
    asked = list(dict.fromkeys(body.task_ids))
    by_id = {r["task_id"]: r for r in await service(request).tasks.batch(asked)}
    rows = [by_id[t] for t in asked if t in by_id]
    return reply(rows, not_found=[t for t in asked if t not in by_id])


@router.post("/runWork", dependencies=[Depends(require_admin)])
async def run_work(request: Request) -> Response:
    """Claim one batch and wait for it to finish."""
    body = await parse_body(request, RunWork)
    jobs = await service(request).worker.run_once(body.batch_size)
    states = await asyncio.gather(*jobs)
    return reply(
        {
            "claimed": len(jobs),
            "succeeded": sum(s == State.SUCCEEDED for s in states),
            "failed": sum(s == State.FAILED for s in states),
        }
    )


@router.post("/cleanWork", dependencies=[Depends(require_admin)])
async def clean_work(request: Request) -> Response:
    return reply((await service(request).cleaner.run_once()).as_dict())
