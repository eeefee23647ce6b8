"""Fixtures of the asynch tests: a private PostgreSQL (session), emptied tables per test, the
emulators, and an in-process asynch service served over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI

from aigcq.asynch.app import create_app
from aigcq.asynch.migrate import migrate
from aigcq.asynch.rebuild import RUN_ID_KEY
from aigcq.asynch.service import AsynchService, open_service
from aigcq.asynch.settings import AsynchSettings
from aigcq.embedded.postgres import EmbeddedPostgres
from aigcq.emulators import model_service, oss, prompts_core
from aigcq.storage import StorageSettings
from tests.fakes.servers import serve_app

TABLES = "asynch_task, asynch_models, asynch_models_type, asynch_model_stat, asynch_callback"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedPostgres]:
    # Under /tmp: when tests run as root, PostgreSQL runs as another user that must reach it.
    data_dir = Path(tempfile.mkdtemp(prefix="aigcq-test-pg-"))
    server = EmbeddedPostgres(data_dir, fast=True)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_url(pg_server: EmbeddedPostgres) -> str:
    asyncio.run(migrate(pg_server.url))
    return pg_server.url


@pytest.fixture
async def db(pg_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection to the migrated database, whose tables start empty."""
    conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
    await conn.execute(f"TRUNCATE {TABLES} RESTART IDENTITY")
    yield conn
    await conn.close()


@dataclass
class Served:
    url: str
    app: FastAPI

    async def stats(self) -> dict[str, Any]:
        async with httpx.AsyncClient() as c:
            return (await c.get(f"{self.url}/_emulator/stats")).json()  # type: ignore[no-any-return]


@pytest.fixture
async def model_emu() -> AsyncIterator[Served]:
    app = model_service.create_app()
    async with serve_app(app) as url:
        yield Served(url, app)


@pytest.fixture
async def prompts_emu() -> AsyncIterator[Served]:
    app = prompts_core.create_app()
    async with serve_app(app) as url:
        yield Served(url, app)


@pytest.fixture
async def oss_emu() -> AsyncIterator[Served]:
    app = oss.create_app()
    async with serve_app(app) as url:
        yield Served(url, app)


def test_settings(**overrides: Any) -> AsynchSettings:
    """Fast settings for tests: short intervals, leases and grace periods."""
    values: dict[str, Any] = {
        "worker_interval_seconds": 0.1,
        "lease_seconds": 2.0,
        "running_grace_seconds": 0.0,
        "gate_grace_seconds": 0.0,
        "model_cache_seconds": 0.0,
        "callback_backoff_seconds": 0.05,
        **overrides,
    }
    return AsynchSettings(**values)


@dataclass
class Asynch:
    url: str
    svc: AsynchService
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
        assert body["code"] == "OK", body
        return body["data"]

    async def error(self, method: str, path: str, code: str, **kwargs: Any) -> str:
        response = await self.call(method, path, **kwargs)
        body = response.json()
        assert response.status_code >= 400 and body["code"] == code, response.text
        return str(body["message"])

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

    async def wait_state(self, task_id: str, *states: int, timeout: float = 10.0) -> int:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            state = (await self.row(task_id))["state"]
            if state in states:
                return int(state)
            assert asyncio.get_running_loop().time() < deadline, f"{task_id} stuck in {state}"
            await asyncio.sleep(0.02)


@pytest.fixture
def asynch_settings() -> AsynchSettings:
    return test_settings()


@pytest.fixture
def storage_settings(tmp_path: Path) -> StorageSettings:
    return StorageSettings(kind="local", local_dir=tmp_path / "files")


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
            async with open_service(
                settings,
                database_url=pg_url,
                redis_url=redis_url,
                data_dir=data_dir,
                storage_settings=storage_settings,
            ) as svc:
                app.state.asynch = svc
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    yield Asynch(url, svc, client, redis, db, app)
    finally:
        await redis.aclose()


@pytest.fixture
async def asynch(
    pg_url: str,
    redis_url: str,
    redis: aioredis.Redis,
    db: psycopg.AsyncConnection[Any],
    tmp_path: Path,
    asynch_settings: AsynchSettings,
    storage_settings: StorageSettings,
) -> AsyncIterator[Asynch]:
    await redis.set(RUN_ID_KEY, "test")  # both start empty: Redis matches the rows
    async with open_asynch(
        pg_url, redis_url, db, tmp_path, asynch_settings, storage_settings
    ) as service:
        yield service
