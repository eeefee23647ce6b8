"""model-asynch for tests: the real service in-process over HTTP (``open_asynch``,
``Asynch``), the emulators it calls (``Served``), and a stand-in for its
``/admin/overview`` (``fake_asynch``) for the dashboard tests."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis.asyncio as aioredis
from bench.processes import ASYNCH_ADMIN_TOKEN
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse

from aigcq.asynch.app import create_app
from aigcq.asynch.errors import NUMBER, OK, STATUS, Code
from aigcq.asynch.process import AsynchProcess, open_process
from aigcq.asynch.runtime import gate_key
from aigcq.asynch.settings import AsynchSettings
from aigcq.storage import StorageSettings
from tests.fakes.servers import serve_app
from tests.fakes.snapshot import redis_snapshot
from tests.fakes.waiting import until

#: the headers a business backend's gateway adds: tenant and user, and a bearer token
USER = {
    "X-User-Info": json.dumps({"tenantId": "t1", "userId": "alice"}),
    "Authorization": "Bearer x",
}


@dataclass
class Served:
    """An emulator served over HTTP, and its app (tests reach into its state)."""

    url: str
    app: FastAPI

    async def stats(self) -> dict[str, Any]:
        async with httpx.AsyncClient() as c:
            return (await c.get(f"{self.url}/_emulator/stats")).json()  # type: ignore[no-any-return]


def fast_settings(**overrides: Any) -> AsynchSettings:
    """Fast settings for tests: short intervals, leases and grace periods, an admin token."""
    values: dict[str, Any] = {
        "admin_token": ASYNCH_ADMIN_TOKEN,
        "worker_interval_seconds": 0.1,
        "lease_seconds": 2.0,
        "running_grace_seconds": 0.0,
        "gate_grace_seconds": 0.0,
        "model_cache_seconds": 0.0,
        "callback_backoff_seconds": 0.05,
        **overrides,
    }
    return AsynchSettings(**values)


def refusal(response: httpx.Response, code: str) -> str:
    """The message of a refusal, checked to be ``code`` in the envelope with its number and
    HTTP status."""
    body = response.json()
    expected = (STATUS[Code(code)], NUMBER[Code(code)], code, None)
    got = (response.status_code, body["code"], body["reason"], body["data"])
    assert got == expected, response.text
    return str(body["message"])


@dataclass
class Asynch:
    """A running asynch service: call its API, read its rows, wait for a task's state."""

    url: str
    svc: AsynchProcess
    client: httpx.AsyncClient
    redis: aioredis.Redis
    db: psycopg.AsyncConnection[Any]
    app: FastAPI | None = None

    async def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await self.client.request(method, path, **kwargs)

    async def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call and expect success; the ``data`` of the envelope."""
        response = await self.call(method, path, **kwargs)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["code"] == OK, body
        return body["data"]

    async def error(self, method: str, path: str, code: str, **kwargs: Any) -> str:
        """Call and expect the refusal ``code`` (its ``reason``); its message."""
        response = await self.call(method, path, **kwargs)
        return refusal(response, code)

    async def create_model(self, name: str, base_url: str, **fields: Any) -> Any:
        return await self.ok("POST", "/model/createModel", json={
            "modelName": name, "baseUrl": base_url, "route": "/gen", **fields
        })  # fmt: skip

    async def create_task(
        self, model: str, payload: Any = None, headers: dict[str, str] | None = None, **fields: Any
    ) -> str:
        body = {"modelName": model, "requestPayload": payload or {"p": 1}, "bizName": "biz"}
        data = await self.ok(
            "POST", "/task/createTask", json={**body, **fields}, headers=headers or {}
        )
        return str(data["task_id"])

    async def row(self, task_id: str) -> dict[str, Any]:
        cur = await self.db.execute(
            "SELECT state, retry_count, attempt, error, oss_file, file_type, text, priority"
            " FROM asynch_task WHERE task_id = %s",
            (task_id,),
        )
        found = await cur.fetchone()
        assert found is not None, task_id
        keys = ["state", "retry_count", "attempt", "error", "oss_file", "file_type", "text",
                "priority"]  # fmt: skip
        return dict(zip(keys, found, strict=True))

    async def run_one(self, model: str) -> None:
        """A task of ``model`` run to its end and its slots freed (the gate and the semaphore
        are released together, just after the row is finished)."""
        await self.wait_state(await self.create_task(model), 2)
        await until(lambda: self.redis.zcard(gate_key(model)), lambda n: n == 0)

    async def snapshot(self) -> dict[str, Any]:
        """Every row of every table of the service's schema, and Redis whole: what "a
        refused request changes nothing" is checked against."""
        cur = await self.db.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema() ORDER BY table_name"
        )
        tables: dict[str, Any] = {}
        for (table,) in await cur.fetchall():
            rows = await self.db.execute(f"SELECT * FROM {table}")  # names from the catalog
            tables[table] = sorted(map(repr, await rows.fetchall()))
        return {"tables": tables, "redis": await redis_snapshot(self.redis)}

    async def wait_state(self, task_id: str, *states: int, timeout: float = 10.0) -> int:
        """Until the task's row is in one of ``states``; that state."""
        row = await until(lambda: self.row(task_id), lambda r: r["state"] in states, timeout)
        return int(row["state"])


@contextlib.asynccontextmanager
async def open_asynch(
    pg_url: str,
    redis_url: str,
    db: psycopg.AsyncConnection[Any],
    data_dir: Path,
    settings: AsynchSettings,
    storage_settings: StorageSettings,
) -> AsyncIterator[Asynch]:
    """An in-process asynch service over real HTTP, on the given PostgreSQL and Redis."""
    redis = aioredis.Redis.from_url(redis_url, decode_responses=True)
    app = create_app()
    try:
        async with serve_app(app) as url:
            settings = settings.model_copy(update={"public_url": url})
            async with open_process(
                settings,
                database_url=pg_url,
                redis_url=redis_url,
                data_dir=data_dir,
                storage_settings=storage_settings,
            ) as svc:
                app.state.asynch = svc
                admin = {"Authorization": f"Bearer {settings.admin_token}"}
                async with httpx.AsyncClient(base_url=url, timeout=30, headers=admin) as client:
                    yield Asynch(url, svc, client, redis, db, app)
    finally:
        await redis.aclose()


OVERVIEW: dict[str, Any] = {
    "time": 0.0,
    "models": [
        {
            "modelName": "sdxl",
            "enabled": True,
            "maxConcurrency": 4,
            "queueLimit": 20,
            "runtimeMaxConcurrency": 2,
            "runtimeQueueLimit": None,
            "gateUsed": 3,
            "semaphoreUsed": 2,
            "semaphoreByTenant": {"t1": 2},
        }
    ],
    "taskCounts": {"queued": 1, "running": 2},
    "recent": [
        {
            "taskId": "a1",
            "modelName": "sdxl",
            "tenantId": "t1",
            "bizName": "b",
            "state": "running",
            "retryCount": 0,
            "created": time.time() - 42,
            "finished": None,
        }
    ],
}


def fake_asynch(token: str) -> FastAPI:
    """Stands in for model-asynch's ``/admin/overview`` (tested for real in tests/asynch)."""
    app = FastAPI()

    @app.get("/admin/overview")
    async def overview(authorization: str = Header("")) -> JSONResponse:
        if authorization != f"Bearer {token}":
            return JSONResponse({"code": NUMBER[Code.UNAUTHORIZED], "reason": "UNAUTHORIZED"}, 401)
        return JSONResponse(OVERVIEW)

    return app
