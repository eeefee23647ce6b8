"""Coze emulator: workflow run (async and sync) and run-history polling as a real HTTP server.

Follows platform-apis.md §2: Bearer auth (``4100`` when missing or unknown), ``4200`` for a
workflow outside the configured set, ``6003`` when async runs are not allowed, and
``run_histories`` answering ``data: [one record]`` that moves from ``Running`` to ``Success``
or ``Fail`` after ``duration_s``, with ``output`` double-encoded and ``4314`` for an unknown
``execute_id``. A run's outcome is drawn when it starts, so a seeded emulator is repeatable.
"""

from __future__ import annotations

import asyncio
import heapq
import secrets
import time
from collections.abc import Set
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from aigcq.emulators._common import EmulatorConfig, EmulatorCore, add_common_routes
from aigcq.emulators._http import read_json, reply, run_app

SPACE_ID = "7350000000000000001"
CONNECTOR_API = "1024"
RUN_MODE_SYNC, RUN_MODE_ASYNC = 0, 2
FAIL_CODE = "5000"
FAILURE_MESSAGE = "emulated workflow failure"
USAGE = {"input_count": 50, "token_count": 150, "output_count": 100}

BAD_PARAMS = (4000, "invalid parameter")
BAD_TOKEN = (4100, "authentication is invalid")
NO_WORKFLOW = (4200, "workflow not found or not published")
NO_RECORD = (4314, "execution record not found")
NO_ASYNC = (6003, "Workflow execution with is_async=true is a premium feature")


@dataclass
class CozeEmulatorConfig(EmulatorConfig):
    """``tokens``/``workflow_ids`` None accept any; ``allow_async`` False answers 6003."""

    tokens: Set[str] | None = None
    workflow_ids: Set[str] | None = None
    allow_async: bool = True


class _Run:
    __slots__ = ("bot_id", "created", "done_at", "failure", "parameters", "run_mode", "workflow_id")

    def __init__(self, workflow_id: str, body: dict[str, Any], run_mode: int, duration: float):
        self.workflow_id = workflow_id
        self.parameters: Any = body.get("parameters") or {}
        self.bot_id = str(body.get("bot_id") or "")
        self.run_mode = run_mode
        self.created = time.time()
        self.done_at = time.monotonic() + duration
        self.failure: str | None = None

    @property
    def done(self) -> bool:
        return time.monotonic() >= self.done_at


def _logid() -> str:
    return time.strftime("%Y%m%d%H%M%S") + secrets.token_hex(10).upper()


def _answer(body: dict[str, Any]) -> Response:
    """Reply with ``detail.logid`` and the matching ``X-Tt-Logid`` header, as Coze does."""
    logid = _logid()
    body["detail"] = {"logid": logid}
    return reply(body, headers={"X-Tt-Logid": logid})


def _error(code_msg: tuple[int, str]) -> Response:
    return _answer({"code": code_msg[0], "msg": code_msg[1]})


def _debug_url(execute_id: str, workflow_id: str) -> str:
    return (
        f"https://www.coze.cn/work_flow?execute_id={execute_id}"
        f"&space_id={SPACE_ID}&workflow_id={workflow_id}"
    )


def _parameters(raw: Any) -> dict[str, Any] | None:
    """``parameters`` as a map: the doc allows an object or a JSON string of one."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        try:
            raw = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
    return raw if isinstance(raw, dict) else None


class _Coze(EmulatorCore):
    config: CozeEmulatorConfig

    def __init__(self, config: CozeEmulatorConfig) -> None:
        super().__init__(config)
        self.runs: dict[str, _Run] = {}
        #: per token, the end times of its async runs not yet counted as ended (a heap)
        self._ends: dict[str, list[float]] = {}

    async def run(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(BAD_TOKEN)
        body = await read_json(request)
        if not isinstance(body, dict):
            return _error(BAD_PARAMS)
        workflow_id, parameters = body.get("workflow_id"), _parameters(body.get("parameters"))
        if not isinstance(workflow_id, str) or not workflow_id or parameters is None:
            return _error(BAD_PARAMS)
        known = self.config.workflow_ids
        if known is not None and workflow_id not in known:
            return _error(NO_WORKFLOW)
        is_async = body.get("is_async") is True
        if is_async and not self.config.allow_async:
            return _error(NO_ASYNC)
        self.remember_base(request)
        execute_id, run = self._start(workflow_id, {**body, "parameters": parameters}, is_async)
        if is_async:
            self._count_run(_token(request), execute_id, run.done_at)
        debug_url = _debug_url(execute_id, workflow_id)
        if is_async and (fault := self.faults.create_fault()) is not None:
            return fault
        if is_async and self.faults.delay_create_reply_s > 0:
            await asyncio.sleep(self.faults.delay_create_reply_s)
        if is_async:
            return _answer(
                {"code": 0, "msg": "Success", "execute_id": execute_id, "debug_url": debug_url}
            )
        await asyncio.sleep(max(0.0, run.done_at - time.monotonic()))
        if run.failure:
            return _answer({"code": int(FAIL_CODE), "msg": run.failure, "debug_url": debug_url})
        return _answer(
            {
                "code": 0,
                "msg": "",
                "data": self._end_node_output(execute_id, run),
                "debug_url": debug_url,
                "usage": USAGE,
            }
        )

    async def history(self, request: Request) -> Response:
        self.counts["polls"] += 1
        if not self._authorized(request):
            return _error(BAD_TOKEN)
        if (fault := self.faults.status_fault()) is not None:
            return fault
        execute_id = request.path_params["execute_id"]
        run = self.runs.get(execute_id)
        if run is None or run.workflow_id != request.path_params["workflow_id"]:
            return _error(NO_RECORD)
        return _answer({"code": 0, "msg": "", "data": [self._record(execute_id, run)]})

    def has_file(self, item_id: str) -> bool:
        run = self.runs.get(item_id)
        return run is not None and run.done and not run.failure

    def stats(self) -> dict[str, Any]:
        self._count_ends()
        return {
            "runs": self.counts["runs"],
            "async_runs": self.counts["async_runs"],
            "polls": self.counts["polls"],
            "running": sum(1 for run in self.runs.values() if not run.done),
            "peak_concurrent": self.records.peaks(),
        }

    def _authorized(self, request: Request) -> bool:
        token = _token(request)
        tokens = self.config.tokens
        return bool(token) and (tokens is None or token in tokens)

    def _count_run(self, token: str, execute_id: str, done_at: float) -> None:
        """Record an async run (Coze has no webhook: no task id or attempt of ours)."""
        self._count_ends()
        self.records.created(token, execute_id)
        heapq.heappush(self._ends.setdefault(token, []), done_at)

    def _count_ends(self) -> None:
        """Count the runs that ended by now as no longer running."""
        now = time.monotonic()
        for token, ends in self._ends.items():
            while ends and ends[0] <= now:
                heapq.heappop(ends)
                self.records.ended(token)

    def records_json(self) -> dict[str, Any]:
        self._count_ends()
        return self.records.as_json()

    def _start(self, workflow_id: str, body: dict[str, Any], is_async: bool) -> tuple[str, _Run]:
        execute_id = self.new_id()
        mode = RUN_MODE_ASYNC if is_async else RUN_MODE_SYNC
        run = self.runs[execute_id] = _Run(workflow_id, body, mode, self.config.duration_s)
        if self.draw_failure():
            run.failure = FAILURE_MESSAGE
        for old_id in self.retention.expired(time.monotonic()):
            del self.runs[old_id]
        self.retention.add(run.done_at, execute_id)
        self.counts["runs"] += 1
        self.counts["async_runs"] += int(is_async)
        return execute_id, run

    def _end_node_output(self, execute_id: str, run: _Run) -> str:
        """The end node's variables as a JSON string: a generated image and the inputs."""
        output = {"output": self.file_url(execute_id), "parameters": run.parameters}
        return orjson.dumps(output).decode()

    def _record(self, execute_id: str, run: _Run) -> dict[str, Any]:
        """One run-history record (the shape of platform-apis.md §2.3)."""
        status = "Running" if not run.done else ("Fail" if run.failure else "Success")
        output = ""
        if status == "Success":
            output = orjson.dumps({"Output": self._end_node_output(execute_id, run)}).decode()
        created = int(run.created)
        return {
            "execute_id": execute_id,
            "execute_status": status,
            "bot_id": run.bot_id,
            "connector_id": CONNECTOR_API,
            "connector_uid": "emulator",
            "run_mode": run.run_mode,
            "logid": _logid(),
            "create_time": created,
            "update_time": created + (round(self.config.duration_s) if run.done else 0),
            "output": output,
            "error_code": FAIL_CODE if status == "Fail" else "",
            "error_message": run.failure if status == "Fail" else "",
            "token": "0",
            "debug_url": _debug_url(execute_id, run.workflow_id),
            "usage": USAGE,
            "is_output_trimmed": False,
        }


def _token(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else ""


def create_app(config: CozeEmulatorConfig) -> FastAPI:
    """A Coze-compatible ASGI app (plus ``/files/...`` and ``/_emulator/stats``)."""
    emulator = _Coze(config)
    app = FastAPI(title="Coze emulator")
    app.add_route("/v1/workflow/run", emulator.run, methods=["POST"])
    app.add_route(
        "/v1/workflows/{workflow_id}/run_histories/{execute_id}", emulator.history, methods=["GET"]
    )
    add_common_routes(app, emulator)
    return app


def run(host: str = "127.0.0.1", port: int = 9102, **options: Any) -> None:
    """Serve until interrupted; ``options`` are :class:`CozeEmulatorConfig` fields."""
    run_app(create_app(CozeEmulatorConfig(**options)), host, port)
