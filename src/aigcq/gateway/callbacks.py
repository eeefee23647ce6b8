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
import redis.exceptions
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from aigcq import metrics
from aigcq.domain import ErrorCode, TaskState
from aigcq.gateway.errors import ClientError
from aigcq.gateway.service import Gateway
from aigcq.jsonlog import ctx
from aigcq.platforms.base import Failed, Pending, ResultOutcome, Succeeded
from aigcq.signing import verify

log = logging.getLogger(__name__)


ParseCallback = Callable[[dict[str, Any]], ResultOutcome]


def callback_routes(gw: Gateway, parse: ParseCallback) -> list[Route]:
    """``parse(body) -> ResultOutcome`` reads a TASK_END body (RunningHub's format, from
    whichever target sent it).

    Plain Starlette routes: this is the hottest inbound path, and it needs none of
    FastAPI's dependency injection. A success is settled in one atomic step and one round
    trip (``finish`` itself answers "unknown task" and "already finished"); any other
    outcome reads the task first, to tell a superseded attempt's failure from a live one.
    """

    async def receive(request: Request) -> JSONResponse:
        target = ""  # known from finish for a success, else from the task read first
        try:
            task_id, attempt, outcome = await _accept(gw, parse, request)
            try:
                if not isinstance(outcome, Succeeded):
                    target = await _check_live(gw, task_id, attempt, outcome)
                done = await gw.outcomes.settle(task_id, outcome, note="callback")
            except redis.exceptions.RedisError as exc:  # the sender retries a 503
                log.warning(
                    "task %s: TASK_END not recorded, Redis unavailable: %s",
                    task_id,
                    exc,
                    extra=ctx(task=task_id),
                )
                raise ClientError(ErrorCode.ASSESSMENT, "storage unavailable", task_id) from exc
        except ClientError as exc:
            metrics.callback_rejected(exc.code.value)
            return JSONResponse(exc.body(gw.messages), status_code=exc.status)
        if done is None:
            return JSONResponse({"code": 0, "msg": "noted"})
        if not done.applied:
            code, detail = (
                (ErrorCode.NOT_FOUND, "unknown task")
                if done.state is None
                else (ErrorCode.GONE, f"task already {done.state}")
            )
            err = ClientError(code, detail, task_id)
            metrics.callback_rejected(err.code.value)
            return JSONResponse(err.body(gw.messages), status_code=err.status)
        gw.outcomes.on_task_end(task_id, done.target or target, isinstance(outcome, Succeeded))
        return JSONResponse({"code": 0, "msg": "success"})

    return [
        Route("/callback", receive, methods=["POST"]),
        Route("/callback/all", receive, methods=["POST"]),
    ]


async def _accept(
    gw: Gateway, parse: ParseCallback, request: Request
) -> tuple[str, int, ResultOutcome]:
    """A signed, well-formed TASK_END: (taskId, attempt, outcome)."""
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
    try:
        outcome = parse(body)
    except (ValueError, TypeError, KeyError, NotImplementedError) as exc:
        raise ClientError(ErrorCode.JSON, f"unreadable eventData: {exc}", task_id) from exc
    if not isinstance(outcome, Succeeded | Failed | Pending):
        raise ClientError(ErrorCode.JSON, "unreadable eventData", task_id)
    log.debug("task %s: TASK_END for attempt %s", task_id, attempt, extra=ctx(task=task_id))
    return task_id, int(attempt), outcome


async def _check_live(gw: Gateway, task_id: str, attempt: int, outcome: ResultOutcome) -> str:
    """The task exists and is not finished; a failure must come from its live attempt.
    Returns the task's target."""
    task = await gw.rt.store.head(task_id)  # routes on state and attempt only
    if task is None:
        raise ClientError(ErrorCode.NOT_FOUND, "unknown task", task_id)
    if task.state.terminal:
        raise ClientError(ErrorCode.GONE, f"task already {task.state}", task_id)
    abandoned = attempt != task.attempt or task.state is TaskState.PENDING
    if isinstance(outcome, Failed) and abandoned:
        # An attempt we gave up on (e.g. cancelled at its deadline) reports its failure;
        # the retry decides. A late *success* still wins (first result wins).
        raise ClientError(ErrorCode.GONE, f"attempt {attempt} was superseded", task_id)
    return task.target
