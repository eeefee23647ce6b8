"""Fixtures of the asynch tests: a private PostgreSQL (session), emptied tables per test, the
emulators, and an in-process asynch service served over real HTTP."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from aigcq.asynch.migrate import migrate
from aigcq.asynch.rebuild import RUN_ID_KEY
from aigcq.asynch.settings import AsynchSettings
from aigcq.embedded.postgres import EmbeddedPostgres
from aigcq.emulators import model_service, oss, prompts_core
from aigcq.storage import StorageSettings
from tests.fakes.asynch import Asynch, Served, fast_settings, open_asynch
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


@pytest.fixture
def asynch_settings() -> AsynchSettings:
    return fast_settings()


@pytest.fixture
def storage_settings(tmp_path: Path) -> StorageSettings:
    return StorageSettings(kind="local", local_dir=tmp_path / "files")


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
