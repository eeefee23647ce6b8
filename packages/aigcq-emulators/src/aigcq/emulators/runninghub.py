"""RunningHub emulator: the legacy ``/task/openapi/*`` API as a real HTTP server.

Follows platform-apis.md §1: every call is ``POST`` JSON, business errors are HTTP 200 with a
non-zero ``code``, task ids are 19-digit strings, a per-apiKey concurrency cap answers
``421 TASK_QUEUE_MAXED``, and each finished task (including a cancelled one) is reported by a
``TASK_END`` webhook whose ``eventData`` is the ``/outputs`` answer as a JSON string, sent by
a few sender tasks off the request path and retried with backoff. A task is QUEUED for
``queue_s``, then RUNNING for ``duration_s``.

A success's output entries carry what the task consumed, as runninghub-sdk's
``TaskOutput`` reads them: ``taskCostTime`` (its seconds), ``consumeCoins``
(``consume_coins``), ``consumeMoney`` (``consume_money``, null unless set: a key billed in
money) and ``thirdPartyConsumeMoney`` (null), all as strings, the task's figures on each
entry.

``accountStatus`` (its key spelt ``apikey``, as the vendor documents it) answers the key's
``currentTaskCounts`` and the account's ``remainCoins`` (``remain_coins``, less each
success's ``consume_coins``); ``GET /openapi/v2/queue/status`` (runninghub-sdk's queue
status: the key as a Bearer token) its ``concurrentLimit``, ``runningCount`` and
``queuedCount``. Both count the ``ghost_tasks`` fault: tasks no create of ours made.

A result file's link is a plain CDN path that answers 404 ``file_ttl_s`` after it was first
handed out, or once expired on demand (``POST /_emulator/files``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Set
from contextlib import asynccontextmanager
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from aigcq.emulators._common import EmulatorConfig, EmulatorCore, add_common_routes
from aigcq.emulators._http import read_json, reply, run_app
from aigcq.emulators._webhook import WebhookOutbox

logger = logging.getLogger(__name__)

QUEUED, RUNNING, SUCCESS, FAILED = "QUEUED", "RUNNING", "SUCCESS", "FAILED"
OUTPUT_NODE_ID = "9"  # SaveImage in ComfyUI's default workflow
PROMPT_TIPS = orjson.dumps(
    {"result": True, "error": None, "outputs_to_execute": [OUTPUT_NODE_ID], "node_errors": {}}
).decode()
FAILURE_MESSAGE = "emulated failure"
CANCEL_MESSAGE = "task cancelled by user"
INSTANCE_TYPES = frozenset({"default", "plus", "ultra"})
#: concurrent webhook senders, each with its own kept-alive connection per origin.
WEBHOOK_SENDERS = 16


class Refusal(IntEnum):
    """The error codes we answer; each one's ``msg`` is its name."""

    PARAMS_INVALID = 301
    WORKFLOW_NOT_EXISTS = 380
    TASK_QUEUE_MAXED = 421
    VALIDATE_PROMPT_FAILED = 433
    APIKEY_UNAUTHORIZED = 802
    APIKEY_INVALID_NODE_INFO = 803
    APIKEY_TASK_NOT_FOUND = 807


@dataclass
class RunningHubEmulatorConfig(EmulatorConfig):
    """``api_keys`` None accepts any key; ``workflow_ids``: the workflows that exist (a create
    for another one is refused 380 WORKFLOW_NOT_EXISTS; None, as the in-process tests use it:
    any; ``aigcq emulate runninghub --workflow-id``: those given, else ``1``);
    ``max_concurrent`` counts QUEUED+RUNNING."""

    max_concurrent: int = 3
    queue_s: float = 0.0
    api_keys: Set[str] | None = None
    workflow_ids: Set[str] | None = None
    webhook_retries: int = 3
    webhook_backoff_s: float = 0.5
    webhook_timeout_s: float = 10.0
    #: what each task consumed, as its outputs report it (``consume_money`` None: a key
    #: billed in coins)
    consume_coins: int = 10
    consume_money: float | None = None
    #: the account's coins (every key's) before any task; each success consumes its coins
    remain_coins: int = 177814


class _Task:
    __slots__ = ("api_key", "failure", "handle", "run_at", "state", "webhook_url")

    def __init__(self, api_key: str, webhook_url: str, run_at: float, failure: str | None):
        self.api_key = api_key
        self.webhook_url = webhook_url
        self.run_at = run_at
        self.failure = failure  # None: it will succeed
        self.state: str | None = None  # None while live, then SUCCESS or FAILED
        self.handle: asyncio.TimerHandle | None = None

    def status(self, now: float) -> str:
        if self.state is not None:
            return self.state
        return QUEUED if now < self.run_at else RUNNING


def _error(refusal: Refusal) -> Response:
    return reply({"code": refusal.value, "msg": refusal.name, "data": None})


def _ok(data: Any) -> Response:
    return reply({"code": 0, "msg": "success", "data": data})


def _node_info_valid(nodes: Any) -> bool:
    return isinstance(nodes, list) and all(
        isinstance(n, dict) and n.get("nodeId") not in (None, "") and n.get("fieldName")
        for n in nodes
    )


def _workflow_json_valid(workflow: Any) -> bool:
    try:
        return isinstance(orjson.loads(workflow), dict)
    except (orjson.JSONDecodeError, TypeError):
        return False


CREATE_TIMES_KEPT = 10_000


class _RunningHub(EmulatorCore):
    config: RunningHubEmulatorConfig

    def __init__(self, config: RunningHubEmulatorConfig) -> None:
        super().__init__(config)
        self.tasks: dict[str, _Task] = {}
        self.remain_coins = config.remain_coins
        self.per_workflow: Counter[str] = Counter()
        #: wall-clock times (epoch s) of the last accepted creates, for benchmarks
        self.create_times: deque[float] = deque(maxlen=CREATE_TIMES_KEPT)
        #: wall-clock times of the last accountStatus queries
        self.account_times: deque[float] = deque(maxlen=CREATE_TIMES_KEPT)
        self._webhook_urls: set[str] = set()
        self._outbox = WebhookOutbox(
            self.counts,
            retries=config.webhook_retries,
            backoff_s=config.webhook_backoff_s,
            timeout_s=config.webhook_timeout_s,
        )

    # ---- lifecycle --------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the webhook senders; on exit stop them and every task timer."""
        async with self._outbox.sending(WEBHOOK_SENDERS):
            try:
                yield
            finally:
                for task in self.tasks.values():
                    if task.handle is not None:
                        task.handle.cancel()

    # ---- routes -----------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        body = await read_json(request)
        if not isinstance(body, dict):
            return _error(Refusal.PARAMS_INVALID)
        if (refused := self._refuse_create(body)) is not None:
            return refused
        api_key: str = body["apiKey"]
        if self.faults.take_full():
            await asyncio.sleep(self.faults.delay_create_reply_s)
            self.counts["rejected_full"] += 1
            return _error(Refusal.TASK_QUEUE_MAXED)
        if self.records.current(api_key) >= self.config.max_concurrent:
            self.counts["rejected_full"] += 1
            return _error(Refusal.TASK_QUEUE_MAXED)
        self.remember_base(request)
        task_id = self._start(api_key, body)
        if (fault := self.faults.create_fault()) is not None:
            return fault
        if self.faults.delay_create_reply_s > 0:
            await asyncio.sleep(self.faults.delay_create_reply_s)
        return _ok(
            {
                "netWssUrl": None,
                "taskId": task_id,
                "clientId": uuid.uuid4().hex,
                "taskStatus": QUEUED if self.config.queue_s > 0 else RUNNING,
                "promptTips": PROMPT_TIPS,
            }
        )

    async def status(self, request: Request) -> Response:
        found = await self._read(request)
        if isinstance(found, Response):
            return found
        return _ok(found[1].status(time.monotonic()))

    async def outputs(self, request: Request) -> Response:
        found = await self._read(request)
        if isinstance(found, Response):
            return found
        return reply(self._outputs_body(*found))

    async def cancel(self, request: Request) -> Response:
        found = await self._lookup(request)
        if isinstance(found, Response):
            return found
        task_id, task = found
        self.records.cancelled(task.api_key, task_id, live=task.state is None)
        if task.state is None and task.failure != CANCEL_MESSAGE:
            if task.handle is not None:
                task.handle.cancel()
            task.failure = CANCEL_MESSAGE
            self.counts["cancelled"] += 1
            if (delay := self.faults.cancel_delay_s) > 0:
                task.handle = asyncio.get_running_loop().call_later(delay, self._finish, task_id)
            else:
                self._finish(task_id)
        return _ok(None)

    async def account_status(self, request: Request) -> Response:
        """``POST /uc/openapi/accountStatus``, its key as ``apikey`` (the vendor's
        documentation; runninghub-sdk sends ``apiKey``, also read): the figures as strings."""
        self.account_times.append(time.time())
        if (fault := self.faults.account_fault()) is not None:
            return fault
        body = await read_json(request)
        api_key = (body.get("apikey") or body.get("apiKey")) if isinstance(body, dict) else None
        refused = self._refuse_key(api_key)
        if refused is not None:
            return refused
        data = {
            "remainCoins": str(self.remain_coins),
            "currentTaskCounts": str(self._counted(str(api_key))),
            "remainMoney": None,
            "currency": None,
            "apiType": "NORMAL",
        }
        return _ok(data)

    async def queue_status(self, request: Request) -> Response:
        """``GET /openapi/v2/queue/status`` (runninghub-sdk's ``get_queue_status``), the key
        as a Bearer token: its concurrency limit and its tasks running and queued."""
        if (fault := self.faults.account_fault()) is not None:
            return fault
        auth = request.headers.get("authorization", "")
        api_key = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        refused = self._refuse_key(api_key)
        if refused is not None:
            return refused
        now = time.monotonic()
        live = [t for t in self.tasks.values() if t.api_key == api_key and t.state is None]
        queued = sum(1 for t in live if t.status(now) == QUEUED)
        running = len(live) - queued + self.faults.ghost_tasks
        return _ok(
            {
                "apiKeyType": "NORMAL",
                "concurrentLimit": self.config.max_concurrent,
                "runningCount": str(running),
                "queuedCount": str(queued),
                "totalCurrentTasks": str(running + queued),
            }
        )

    def _counted(self, api_key: str) -> int:
        """The key's tasks running or queued, as the platform counts them (ghosts too)."""
        return self.records.current(api_key) + self.faults.ghost_tasks

    # ---- introspection ----------------------------------------------------------------

    def has_file(self, item_id: str) -> bool:
        task = self.tasks.get(item_id)
        return task is not None and task.state == SUCCESS

    def stats(self) -> dict[str, Any]:
        return {
            "created": self.counts["created"],
            "rejected_full": self.counts["rejected_full"],
            "cancelled": self.counts["cancelled"],
            "succeeded": self.counts["succeeded"],
            "failed": self.counts["failed"],
            "webhooks_delivered": self.counts["webhooks_delivered"],
            "webhooks_failed": self.counts["webhooks_failed"],
            "duplicate_creates": self.counts["duplicate_creates"],
            "current": self.records.currents(),
            "peak_concurrent": self.records.peaks(),
            "creates_per_workflow": dict(self.per_workflow),
            "create_times": list(self.create_times),
            "account_status_times": list(self.account_times),
            "remain_coins": self.remain_coins,
        }

    # ---- internals --------------------------------------------------------------------

    def _refuse_key(self, api_key: Any) -> Response | None:
        if not isinstance(api_key, str) or not api_key:
            return _error(Refusal.PARAMS_INVALID)
        if self.config.api_keys is not None and api_key not in self.config.api_keys:
            return _error(Refusal.APIKEY_UNAUTHORIZED)
        return None

    def _refuse_create(self, body: dict[str, Any]) -> Response | None:
        """The error answer for an invalid create body, or None when it is acceptable."""
        if (refused := self._refuse_key(body.get("apiKey"))) is not None:
            return refused
        workflow_id, workflow = body.get("workflowId"), body.get("workflow")
        webhook_url, instance = body.get("webhookUrl"), body.get("instanceType")
        if workflow is None and (workflow_id == "" or not isinstance(workflow_id, str | int)):
            return _error(Refusal.PARAMS_INVALID)
        if webhook_url is not None and not isinstance(webhook_url, str):
            return _error(Refusal.PARAMS_INVALID)
        if instance is not None and instance not in INSTANCE_TYPES:
            return _error(Refusal.PARAMS_INVALID)
        if workflow is not None and not _workflow_json_valid(workflow):
            return _error(Refusal.VALIDATE_PROMPT_FAILED)
        known = self.config.workflow_ids
        if workflow is None and known is not None and str(workflow_id) not in known:
            return _error(Refusal.WORKFLOW_NOT_EXISTS)
        if not _node_info_valid(body.get("nodeInfoList", [])):
            return _error(Refusal.APIKEY_INVALID_NODE_INFO)
        return None

    def _start(self, api_key: str, body: dict[str, Any]) -> str:
        """Record a new task, count it against its key, and schedule its end."""
        task_id = self.new_id()
        webhook_url = body.get("webhookUrl") or ""
        failure = FAILURE_MESSAGE if self.draw_failure() else None
        run_at = time.monotonic() + self.config.queue_s
        task = self.tasks[task_id] = _Task(api_key, webhook_url, run_at, failure)
        loop = asyncio.get_running_loop()
        task.handle = loop.call_later(
            self.config.queue_s + self.config.duration_s, self._finish, task_id
        )
        self.records.created(api_key, task_id, webhook_url)
        self.counts["created"] += 1
        self.create_times.append(time.time())
        self.per_workflow[str(body.get("workflowId", ""))] += 1
        if webhook_url:
            if webhook_url in self._webhook_urls:
                self.counts["duplicate_creates"] += 1
            self._webhook_urls.add(webhook_url)
        return task_id

    async def _read(self, request: Request) -> tuple[str, _Task] | Response:
        """:meth:`_lookup` for a status or outputs read: an injected status fault answers first."""
        if (fault := self.faults.status_fault()) is not None:
            return fault
        return await self._lookup(request)

    async def _lookup(self, request: Request) -> tuple[str, _Task] | Response:
        """The task named by ``{apiKey, taskId}``, or the error answer."""
        body = await read_json(request)
        if not isinstance(body, dict) or body.get("taskId") in (None, ""):
            return _error(Refusal.PARAMS_INVALID)
        if (refused := self._refuse_key(body.get("apiKey"))) is not None:
            return refused
        task_id = str(body["taskId"])
        task = self.tasks.get(task_id)
        if task is None or task.api_key != body["apiKey"]:
            return _error(Refusal.APIKEY_TASK_NOT_FOUND)
        return task_id, task

    def _outputs_body(self, task_id: str, task: _Task) -> dict[str, Any]:
        status = task.status(time.monotonic())
        if status == QUEUED:
            return {"code": 813, "msg": "APIKEY_TASK_IS_QUEUED", "data": None}
        if status == RUNNING:
            return {"code": 804, "msg": "APIKEY_TASK_IS_RUNNING", "data": None}
        if status == FAILED:
            reason = {
                "node_id": OUTPUT_NODE_ID,
                "node_name": "SaveImage",
                "exception_type": "RuntimeError",
                "exception_message": task.failure,
                "traceback": "[]",
                "current_inputs": "{}",
                "current_outputs": "{}",
            }
            return {
                "code": 805,
                "msg": "APIKEY_TASK_STATUS_ERROR",
                "data": {"failedReason": reason},
            }
        output = {
            "fileUrl": self.file_url(task_id),
            "fileType": "png",
            "taskCostTime": str(round(self.config.duration_s)),
            "nodeId": OUTPUT_NODE_ID,
            **self._consumed(),
        }
        return {"code": 0, "msg": "success", "data": [output]}

    def _consumed(self) -> dict[str, str | None]:
        money = self.config.consume_money
        return {
            "consumeCoins": str(self.config.consume_coins),
            "consumeMoney": None if money is None else f"{money:.2f}",
            "thirdPartyConsumeMoney": None,
        }

    def _finish(self, task_id: str) -> None:
        """End a task: free its slot, queue its webhook, forget tasks past retention."""
        task = self.tasks[task_id]
        task.handle = None
        task.state = FAILED if task.failure else SUCCESS
        self.records.ended(task.api_key)
        if not task.failure:
            self.remain_coins -= self.config.consume_coins
        self.counts["failed" if task.failure else "succeeded"] += 1
        if task.webhook_url:
            event = {
                "event": "TASK_END",
                "taskId": task_id,
                "eventData": orjson.dumps(self._outputs_body(task_id, task)).decode(),
            }
            if late := self.faults.webhook_delay_s():
                loop = asyncio.get_running_loop()
                loop.call_later(late, self._outbox.put, task.webhook_url, orjson.dumps(event))
            else:
                self._outbox.put(task.webhook_url, orjson.dumps(event))
        now = time.monotonic()
        for old_id in self.retention.expired(now):
            self._webhook_urls.discard(self.tasks.pop(old_id).webhook_url)
        self.retention.add(now, task_id)


def create_app(config: RunningHubEmulatorConfig) -> FastAPI:
    """A RunningHub-compatible ASGI app (plus ``/files/...`` and ``/_emulator/stats``)."""
    emulator = _RunningHub(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with emulator.running():
            yield

    app = FastAPI(title="RunningHub emulator", lifespan=lifespan)
    routes = {
        "/task/openapi/create": emulator.create,
        "/task/openapi/status": emulator.status,
        "/task/openapi/outputs": emulator.outputs,
        "/task/openapi/cancel": emulator.cancel,
        "/uc/openapi/accountStatus": emulator.account_status,
    }
    for path, handler in routes.items():
        app.add_route(path, handler, methods=["POST"])
    app.add_route("/openapi/v2/queue/status", emulator.queue_status, methods=["GET"])
    add_common_routes(app, emulator)
    return app


def run(host: str = "127.0.0.1", port: int = 9101, **options: Any) -> None:
    """Serve until interrupted; ``options`` are :class:`RunningHubEmulatorConfig` fields."""
    run_app(create_app(RunningHubEmulatorConfig(**options)), host, port)
