"""The message-dispatcher's HTTP API: its own ``/api/*`` routes (seed 000 §2.3, §3.5) and
RunningHub-compatible ``/task/openapi/*`` routes (platform-apis.md §1), ``apiKey`` = JWT.

Every route checks the token before it reads or changes anything; bad input gets a clear
error and queues nothing.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from aigcq.bridges.hub import BridgeHub
from aigcq.dispatcher.auth import LOGIN_HINT, TOKEN_HINT, DispatcherAuth
from aigcq.dispatcher.degrade import handed_back
from aigcq.dispatcher.formats import BadBody, outputs_body, status_of, task_payload
from aigcq.dispatcher.webhooks import WEBHOOK_BACKEND
from aigcq.domain import Task
from aigcq.gateway.errors import ClientError
from aigcq.gateway.http_api import bounded_body
from aigcq.gateway.queue_view import internal_capacity, queue_rows
from aigcq.gateway.submission import GenerateRequest
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.auth import bearer
from aigcq.serve.parts import ServeParts

log = logging.getLogger(__name__)

PLATFORM = "comfyui"
TOKEN_REFUSAL = f"missing, invalid or expired token: {TOKEN_HINT} as Authorization: Bearer"
RH_PARAMS_INVALID = (301, "PARAMS_INVALID")
RH_UNAUTHORIZED = (802, "APIKEY_UNAUTHORIZED")
RH_NOT_FOUND = (807, "APIKEY_TASK_NOT_FOUND")
RH_QUEUE_MAXED = (421, "TASK_QUEUE_MAXED")
RECENT = 20
#: RunningHub's create answer carries ComfyUI's validation as a JSON string; a bridge
#: validates only when it runs the prompt, so this says "accepted" (clients such as
#: runninghub-sdk read it).
PROMPT_TIPS = orjson.dumps(
    {"result": True, "error": None, "outputs_to_execute": [], "node_errors": {}}
).decode()


def md_error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"success": False, "error": {"code": code, "message": message}}, status)


def md_ok(data: Any) -> JSONResponse:
    return JSONResponse({"success": True, "data": data})


def rh_reply(code_msg: tuple[int, str], data: Any = None) -> JSONResponse:
    return JSONResponse({"code": code_msg[0], "msg": code_msg[1], "data": data})


def rh_ok(data: Any) -> JSONResponse:
    return rh_reply((0, "success"), data)


class DispatcherApi:
    def __init__(
        self,
        service: ServeParts,
        auth: DispatcherAuth,
        aigc: str,
        on_accepted: Callable[[], None] = lambda: None,
    ) -> None:
        self.service = service
        self.rt = service.rt
        self.auth = auth
        self.aigc = aigc
        #: a task was queued: the backends' free-slot estimate must be resynced
        self.on_accepted = on_accepted

    def routes(self) -> list[Route]:
        md = {
            "/api/auth/login": (self.login, "POST"),
            "/api/task": (self.create_md, "POST"),
            "/api/health": (self.health, "GET"),
            "/api/overview": (self.overview, "GET"),
        }
        rh = {
            "/task/openapi/create": self.create_rh,
            "/task/openapi/status": self.status_rh,
            "/task/openapi/outputs": self.outputs_rh,
            "/task/openapi/cancel": self.cancel_rh,
            "/uc/openapi/accountStatus": self.account_rh,
        }
        return [Route(p, h, methods=[m]) for p, (h, m) in md.items()] + [
            Route(p, h, methods=["POST"]) for p, h in rh.items()
        ]

    # ---- /api/* -----------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        body = await self._json(request, LOGIN_BODY_LIMIT)  # credentials: a small body
        if not isinstance(body, dict):
            return md_error(400, "InvalidBody", "expected {username, password}")
        user, password = body.get("username"), body.get("password")
        if not (isinstance(user, str) and isinstance(password, str)):
            return md_error(400, "InvalidBody", "username and password must be strings")
        token = self.auth.login(user, password)
        if token is None:
            log.warning("login refused for %r", user)
            return md_error(401, "Unauthorized", f"invalid username or password: {LOGIN_HINT}")
        log.info("token issued to %r (valid %d s)", user, token.expires_in)
        return md_ok(token.body())

    async def create_md(self, request: Request) -> Response:
        """Seed 000 §3.3: a RunningHub create body; answers ``{requestId, taskId}``."""
        token = bearer(request.headers.get("authorization"))
        if token is not None and not self.auth.valid(token):  # before reading the body
            return md_error(401, "Unauthorized", TOKEN_REFUSAL)
        body = await self._json(request)
        if token is None and not self.auth.valid(_api_key(body)):
            return md_error(401, "Unauthorized", TOKEN_REFUSAL)
        try:
            task_id = await self._submit(body, request.headers.get("traceparent"))
        except BadBody as exc:
            return md_error(400, "InvalidBody", str(exc))
        except ClientError as exc:
            return md_error(exc.status, exc.code.value, exc.detail)
        return md_ok({"requestId": task_id, "taskId": task_id})

    async def health(self, _request: Request) -> Response:
        return md_ok(self._capacity())

    async def overview(self, request: Request) -> Response:
        if not self.auth.valid(bearer(request.headers.get("authorization"))):
            return md_error(401, "Unauthorized", TOKEN_REFUSAL)
        recent = await self.rt.store.reads.recent(RECENT)
        return md_ok(
            {
                **self._capacity(),
                "bridgeList": [
                    {
                        "bridgeId": b.bridge_id,
                        "instances": b.instance_count,
                        "free": b.free(),
                        "running": len(b.running),
                        "outOfRotation": b.quarantined_at is not None,
                    }
                    for b in self._hub().registry.live()
                ],
                "queues": await queue_rows(self.service.rt, internal_capacity(self.service.hub)),
                "recentTasks": [
                    {"taskId": t.task_id, "status": status_of(t), "attempt": t.attempt}
                    for t in recent
                ],
            }
        )

    # ---- RunningHub-compatible ----------------------------------------------------------

    async def create_rh(self, request: Request) -> Response:
        body = await self._json(request)
        if not self.auth.valid(_api_key(body)):
            return rh_reply(RH_UNAUTHORIZED)
        try:
            task_id = await self._submit(body, request.headers.get("traceparent"))
        except BadBody as exc:
            return rh_reply(RH_PARAMS_INVALID, str(exc))
        except ClientError as exc:
            return rh_reply(RH_QUEUE_MAXED, exc.detail)
        return rh_ok(
            {
                "taskId": task_id,
                "taskStatus": "QUEUED",
                "clientId": uuid.uuid4().hex,
                "netWssUrl": None,
                "promptTips": PROMPT_TIPS,
            }
        )

    async def status_rh(self, request: Request) -> Response:
        found = await self._lookup(request)
        return found if isinstance(found, Response) else rh_ok(status_of(found))

    async def outputs_rh(self, request: Request) -> Response:
        found = await self._lookup(request)
        return found if isinstance(found, Response) else JSONResponse(outputs_body(found))

    async def cancel_rh(self, request: Request) -> Response:
        found = await self._lookup(request)
        if isinstance(found, Response):
            return found
        if not found.state.terminal:
            try:
                await self.service.gateway.cancel(found.task_id, None)
            except ClientError as exc:  # finished meanwhile: nothing left to cancel
                log.info(
                    "task %s: cancel skipped: %s",
                    found.task_id,
                    exc.detail,
                    extra=ctx(task=found.task_id),
                )
        return rh_ok(None)

    async def account_rh(self, request: Request) -> Response:
        body = await self._json(request)
        key = (body.get("apikey") or body.get("apiKey")) if isinstance(body, dict) else None
        if not self.auth.valid(key):
            return rh_reply(RH_UNAUTHORIZED)
        keys = self.rt.store.keys
        pipe = self.rt.redis.pipeline(transaction=False)
        pipe.zcard(keys.wait(self.aigc, PLATFORM))
        pipe.zcard(keys.running(self.aigc, self._hub().name))
        waiting, running = await pipe.execute()
        data = {
            "remainCoins": "0",
            "currentTaskCounts": str(int(waiting) + int(running)),
            "remainMoney": None,
            "currency": None,
            "apiType": "NORMAL",
        }
        return rh_ok(data)

    # ---- helpers ------------------------------------------------------------------------

    async def _json(self, request: Request, limit: int = 0) -> Any:
        """The JSON body, or ``None`` when it is not JSON. A body over ``limit`` (default
        AIGCQ_MAX_PAYLOAD_BYTES) is refused with 413 as soon as it passes the limit."""
        raw = await bounded_body(request, limit or self.rt.settings.max_payload_bytes)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None

    async def _submit(self, body: Any, trace: str | None = None) -> str:
        """Queue a create body for our bridges; the new task's id. ``trace``: the
        request's W3C ``traceparent`` header (the parent of the task's trace)."""
        payload = task_payload(body)
        task_id = uuid.uuid4().hex
        req = GenerateRequest(
            taskId=task_id, platform=PLATFORM, payload=payload, AIGC=self.aigc, traceparent=trace
        )
        submission = self.service.gateway.submission
        await submission.submit(req, WEBHOOK_BACKEND, deliver=True, principal=WEBHOOK_BACKEND)
        self.on_accepted()
        log.info(
            "task %s: queued (webhook %s)",
            task_id,
            payload.get("webhookUrl") or "-",
            extra=ctx(task=task_id),
        )
        return task_id

    async def _lookup(self, request: Request) -> Task | Response:
        """The task named by ``{apiKey, taskId}``, or RunningHub's error answer."""
        body = await self._json(request)
        task_id = body.get("taskId") if isinstance(body, dict) else None
        if not isinstance(task_id, str | int) or task_id == "":
            return rh_reply(RH_PARAMS_INVALID)
        if not self.auth.valid(_api_key(body)):
            return rh_reply(RH_UNAUTHORIZED)
        task = await self.rt.store.reads.get(str(task_id))
        if task is None or task.backend_id != WEBHOOK_BACKEND or handed_back(task):
            return rh_reply(RH_NOT_FOUND)  # a task handed back is its backend's again
        return task

    def _hub(self) -> BridgeHub:
        assert self.service.hub is not None, "the message-dispatcher runs its own bridge hub"
        return self.service.hub

    def _capacity(self) -> dict[str, Any]:
        hub = self._hub()
        live = hub.registry.live()
        return {
            "healthy": hub.healthy,
            "status": hub.health.health.state.value,
            "bridges": len(live),
            "instances": sum(b.instance_count for b in live),
            "freeSlots": hub.free_slots(),
        }


#: a login body holds a user name and a password
LOGIN_BODY_LIMIT = 4096


def _api_key(body: Any) -> Any:
    return body.get("apiKey") if isinstance(body, dict) else None
