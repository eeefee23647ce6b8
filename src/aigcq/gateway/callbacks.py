"""``POST /callback`` and ``/callback/all``: TASK_END webhooks (seed 001 §5A, seed 002 §3).

The URL we handed out carries ``t`` (taskId), ``a`` (attempt) and ``s`` (HMAC). A bad or
missing signature -> 403; an unknown task -> 404; a task already finished -> 410 (the
first result wins). All of them change nothing. A valid one settles the task in one
atomic step and answers at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from aigcq import metrics
from aigcq.domain import ErrorCode, Task, TaskState
from aigcq.gateway.errors import ClientError
from aigcq.gateway.service import Gateway
from aigcq.jsonlog import ctx
from aigcq.platforms.base import Failed, Pending, ResultOutcome, Succeeded
from aigcq.signing import verify

log = logging.getLogger(__name__)


ParseCallback = Callable[[Task, dict[str, Any]], ResultOutcome]


def callback_routes(gw: Gateway, parse: ParseCallback) -> list[Route]:
    """``parse(task, body) -> ResultOutcome`` picks the adapter that reads the body.

    Plain Starlette routes: this is the hottest inbound path, and it needs none of
    FastAPI's dependency injection.
    """

    async def receive(request: Request) -> JSONResponse:
        try:
            outcome, task = await _accept(gw, parse, request)
        except ClientError as exc:
            metrics.callback_rejected(exc.code.value)
            return JSONResponse(exc.body(gw.messages), status_code=exc.status)
        done = await gw.outcomes.settle(task.task_id, outcome, note="callback")
        if done is None:
            return JSONResponse({"code": 0, "msg": "noted"})
        if not done.applied:
            err = ClientError(ErrorCode.GONE, f"task already {done.state}", task.task_id)
            return JSONResponse(err.body(gw.messages), status_code=err.status)
        gw.outcomes.on_task_end(task, isinstance(outcome, Succeeded))
        return JSONResponse({"code": 0, "msg": "success"})

    return [
        Route("/callback", receive, methods=["POST"]),
        Route("/callback/all", receive, methods=["POST"]),
    ]


async def _accept(
    gw: Gateway, parse: ParseCallback, request: Request
) -> tuple[ResultOutcome, Task]:
    q = request.query_params
    task_id, attempt, sig = q.get("t", ""), q.get("a", ""), q.get("s", "")
    if not (task_id and attempt.isdigit() and sig):
        raise ClientError(ErrorCode.SIGNATURE, "callback URL is not signed")
    if not verify(gw.settings.signing_key(), task_id, int(attempt), sig):
        raise ClientError(ErrorCode.SIGNATURE, "bad callback signature", task_id)
    raw = await request.body()
    if len(raw) > gw.settings.max_payload_bytes:
        raise ClientError(ErrorCode.PAYLOAD_TOO_LARGE, "callback body too large", task_id)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ClientError(ErrorCode.JSON, "malformed JSON", task_id) from exc
    if not isinstance(body, dict) or body.get("event", "TASK_END") != "TASK_END":
        raise ClientError(ErrorCode.JSON, "expected a TASK_END event", task_id)
    task = await gw.rt.store.head(task_id)  # TASK_END routes on target; no payload needed
    if task is None:
        raise ClientError(ErrorCode.NOT_FOUND, "unknown task", task_id)
    if task.state.terminal:
        raise ClientError(ErrorCode.GONE, f"task already {task.state}", task_id)
    try:
        outcome = parse(task, body)
    except (ValueError, TypeError, KeyError, NotImplementedError) as exc:
        raise ClientError(ErrorCode.JSON, f"unreadable eventData: {exc}", task_id) from exc
    if not isinstance(outcome, Succeeded | Failed | Pending):
        raise ClientError(ErrorCode.JSON, "unreadable eventData", task_id)
    abandoned = int(attempt) != task.attempt or task.state is TaskState.PENDING
    if isinstance(outcome, Failed) and abandoned:
        # An attempt we gave up on (e.g. cancelled at its deadline) reports its failure;
        # the retry decides. A late *success* still wins (first result wins).
        raise ClientError(ErrorCode.GONE, f"attempt {attempt} was superseded", task_id)
    log.debug("task %s: TASK_END for attempt %s", task_id, attempt, extra=ctx(task=task_id))
    return outcome, task
