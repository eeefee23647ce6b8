"""``POST /callback`` and ``/callback/all``: TASK_END webhooks (seed 001 §5A, seed 002 §3).

The URL we handed out carries ``t`` (taskId), ``a`` (attempt) and ``s`` (HMAC). A bad or
missing signature -> 403; an unknown task -> 404; a task already finished -> 410 (the
first result wins); a body over the limit -> 413, seen before it is read whole. All of
them change nothing, except that a run that ended is no longer counted: the TASK_END of
an attempt whose remote task was unwanted (an orphan) releases its cap slot, 410 or not.
A valid one settles the task in one atomic step and answers at once — unless it comes to a
URL marked ``k=1`` (a paid target whose result files may be copied, see
:mod:`aigcq.delivery.custody`): then the files are copied first, when the rules want it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

import orjson
import redis.exceptions
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from aigcq.domain import ErrorCode, TaskState
from aigcq.gateway.errors import ClientError
from aigcq.gateway.gateway import Gateway
from aigcq.observability import metrics
from aigcq.observability.jsonlog import ctx
from aigcq.platforms.base import Failed, Pending, ResultOutcome, Succeeded
from aigcq.platforms.runninghub import RunningHubAdapter
from aigcq.plumbing.asgi_body import read_body
from aigcq.plumbing.http_body import BodyTooLarge, Disconnected
from aigcq.plumbing.signing import verify
from aigcq.wire.bridge import failure_of

log = logging.getLogger(__name__)


#: what a refused sender must change (issue 30 item 5): each URL we hand out is signed
UNSIGNED = (
    "callback URL is not signed: POST the TASK_END to the webhookUrl its TASK_ASSIGN (or "
    "create) carried, exactly as given, query t, a and s included"
)
BAD_SIGNATURE = (
    "bad callback signature: every aigcq process must share one AIGCQ_CALLBACK_SECRET "
    "(default: TOKEN_SECRET); a URL signed by another deployment is refused"
)

ParseCallback = Callable[[dict[str, Any]], ResultOutcome]
_RUNNINGHUB_FORMAT = RunningHubAdapter("")


def parse_task_end(body: dict[str, Any]) -> ResultOutcome:
    """TASK_END bodies share RunningHub's format, whichever target sent them (bridges,
    the message-dispatcher and RunningHub itself): no need to know the task first.
    A bridge's failure keeps its class and specific code (see ``docs/bridge-protocol.md``)."""
    outcome = _RUNNINGHUB_FORMAT.parse_result(body)
    failure = failure_of(body.get("eventData"))
    if isinstance(outcome, Failed) and failure is not None:
        detail = {"class": failure.failure_class}
        return Failed(failure.code, failure.message, detail=detail)
    return outcome


def callback_routes(gw: Gateway, parse: ParseCallback = parse_task_end) -> list[Route]:
    """``parse(body) -> ResultOutcome`` reads a TASK_END body."""
    endpoint = TaskEndEndpoint(gw, parse)
    return [
        Route("/callback", endpoint, methods=["POST"]),
        Route("/callback/all", endpoint, methods=["POST"]),
    ]


class TaskEndEndpoint:
    """The TASK_END webhook as a plain ASGI app: this is the hottest inbound path, and a
    Starlette Request, its exception wrappers and a JSONResponse cost more than the work.

    A success is settled in one atomic step and one round trip (``finish`` itself answers
    "unknown task" and "already finished"); any other outcome reads the task first, to
    tell a superseded attempt's failure from a live one.
    """

    def __init__(self, gw: Gateway, parse: ParseCallback) -> None:
        self.gw = gw
        self.parse = parse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            status, body = await self._handle(scope, receive)
        except Disconnected:
            return
        payload = orjson.dumps(body)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(payload)),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _handle(self, scope: Scope, receive: Receive) -> tuple[int, dict[str, Any]]:
        gw = self.gw
        target = ""  # known from finish for a success, else from the task read first
        task_id, attempt = "", 0
        try:
            task_id, attempt, outcome, keep = await _accept(gw, self.parse, scope, receive)
            try:
                if not isinstance(outcome, Succeeded):
                    target = await _target_of(gw, task_id)
                done = await gw.lifecycle.settle(
                    task_id, outcome, "callback", attempt=attempt, target=target, keep=keep
                )
                await gw.lifecycle.made_durable(task_id, "its TASK_END")  # before any 200
            except redis.exceptions.RedisError as exc:  # the sender retries a 503
                log.warning(
                    "task %s: TASK_END not recorded, Redis unavailable: %s",
                    task_id,
                    exc,
                    extra=ctx(task=task_id),
                )
                raise ClientError(ErrorCode.ASSESSMENT, "storage unavailable", task_id) from exc
            if done is None:
                return 200, {"code": 0, "msg": "noted"}
            if not done.applied:
                if done.state is None:
                    raise ClientError(ErrorCode.NOT_FOUND, "unknown task", task_id)
                if done.superseded:
                    # An attempt we gave up on (e.g. cancelled at its deadline) reports its
                    # failure; the retry decides. A late *success* still wins.
                    raise ClientError(ErrorCode.GONE, f"attempt {attempt} was superseded", task_id)
                if await _repeated(gw, task_id, attempt, outcome):
                    return 200, {"code": 0, "msg": "already recorded"}
                raise ClientError(ErrorCode.GONE, f"task already {done.state}", task_id)
        except ClientError as exc:  # a run refused as gone was announced over all the same
            metrics.callback_rejected(exc.code.value)
            return exc.status, exc.body(gw.messages)
        return 200, {"code": 0, "msg": "success"}


async def _repeated(gw: Gateway, task_id: str, attempt: int, outcome: ResultOutcome) -> bool:
    """Whether a TASK_END the task is already over by is a repeat of the one that ended it
    (its attempt, its outcome): acknowledged, so a sender that retries until a 2xx (as
    RunningHub does) stops, and it changes nothing."""
    task = await gw.rt.store.reads.head(task_id)
    ended = {TaskState.SUCCESS: Succeeded, TaskState.FAILED: Failed}
    kind = ended.get(task.state) if task is not None else None
    return (
        task is not None
        and task.attempt == attempt
        and kind is not None
        and isinstance(outcome, kind)
    )


async def _accept(
    gw: Gateway, parse: ParseCallback, scope: Scope, receive: Receive
) -> tuple[str, int, ResultOutcome, bool]:
    """A signed, well-formed TASK_END: (taskId, attempt, outcome, its URL is marked ``k=1``)."""
    q = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    task_id, attempt, sig = q.get("t", ""), q.get("a", ""), q.get("s", "")
    if not (task_id and _is_attempt(attempt) and sig):
        raise ClientError(ErrorCode.SIGNATURE, UNSIGNED)
    if not verify(gw.settings.signing_key(), task_id, int(attempt), sig):
        raise ClientError(ErrorCode.SIGNATURE, BAD_SIGNATURE, task_id)
    try:
        raw = await read_body(scope, receive, gw.settings.max_payload_bytes)
    except BodyTooLarge as exc:
        raise ClientError(ErrorCode.PAYLOAD_TOO_LARGE, "callback body too large", task_id) from exc
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ClientError(ErrorCode.JSON, "malformed JSON", task_id) from exc
    if not isinstance(body, dict) or body.get("event", "TASK_END") != "TASK_END":
        raise ClientError(ErrorCode.JSON, "expected a TASK_END event", task_id)
    try:
        outcome = parse(body)
    except (ValueError, TypeError, KeyError, NotImplementedError, RecursionError) as exc:
        raise ClientError(ErrorCode.JSON, f"unreadable eventData: {exc}", task_id) from exc
    if not isinstance(outcome, Succeeded | Failed | Pending):
        raise ClientError(ErrorCode.JSON, "unreadable eventData", task_id)
    log.debug("task %s: TASK_END for attempt %s", task_id, attempt, extra=ctx(task=task_id))
    return task_id, int(attempt), outcome, q.get("k") == "1"


def _is_attempt(value: str) -> bool:
    """An attempt number as we write them: ASCII digits, at most 9 (``int`` would accept
    other scripts' digits and refuse 5,000 of them with an error)."""
    return 0 < len(value) <= 9 and value.isascii() and value.isdigit()


async def _target_of(gw: Gateway, task_id: str) -> str:
    """The task's target (it exists). Whether it is still live, and whether a failure
    comes from the live attempt, is decided inside the finishing script, which also
    releases the orphan of that attempt, if any, even when the task is over."""
    task = await gw.rt.store.reads.head(task_id)  # routes on state and target only
    if task is None:
        raise ClientError(ErrorCode.NOT_FOUND, "unknown task", task_id)
    return task.target
