"""Switching from the Go service: adopting its database, reading its config.yml."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
import redis.asyncio as aioredis

from aigcq.asynch import goconfig
from aigcq.asynch.migrate import SchemaMismatch, available, migrate
from aigcq.asynch.settings import AsynchSettings
from aigcq.storage import StorageSettings
from tests.fakes.asynch import Served, fast_settings, open_asynch


@pytest.fixture
async def fresh_db(pg_url: str) -> AsyncIterator[str]:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        await admin.execute("DROP DATABASE IF EXISTS asynch_go_test")
        await admin.execute("CREATE DATABASE asynch_go_test")
    yield pg_url.replace("/postgres?", "/asynch_go_test?")


async def test_migrate_adopts_the_go_services_tables(fresh_db: str) -> None:
    initial = available()[0].sql  # the seed's update.sql, applied by hand as the Go team did
    go_sql = initial.replace("UNIQUE (day, tenant_id, creator, model_name)", "id2 INT")
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute(go_sql.encode())
        await conn.execute(
            "INSERT INTO asynch_models (model_name, base_url) VALUES ('kept', 'http://h')"
        )
    later = [m.version for m in available()[1:]]
    assert await migrate(fresh_db) == later
    assert await migrate(fresh_db) == []
    async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
        cur = await conn.execute("SELECT version, name FROM asynch_schema_migrations ORDER BY 1")
        rows = await cur.fetchall()
        assert rows[0] == (1, "initial (adopted)") and [r[0] for r in rows[1:]] == later
        cur = await conn.execute("SELECT model_name FROM asynch_models")
        assert await cur.fetchall() == [("kept",)]
        cur = await conn.execute(  # the missing unique key the stats upsert needs was added
            "SELECT count(*) FROM pg_indexes WHERE indexname = %s",
            ("asynch_model_stat_day_tenant_id_creator_model_name_key",),
        )
        assert await cur.fetchone() == (1,)


async def test_migrate_refuses_a_schema_it_cannot_adopt(fresh_db: str) -> None:
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute(available()[0].sql.encode())
        await conn.execute("ALTER TABLE asynch_task DROP COLUMN user_info")
        await conn.execute("DROP TABLE asynch_model_stat")
    with pytest.raises(SchemaMismatch, match=r"asynch_task\.user_info, asynch_model_stat"):
        await migrate(fresh_db)
    async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
        cur = await conn.execute("SELECT count(*) FROM asynch_schema_migrations")
        assert await cur.fetchone() == (0,)


async def test_go_style_text_json_columns_are_json_again(
    fresh_db: str, redis_url: str, redis: aioredis.Redis, model_emu: Served, tmp_path: Path
) -> None:
    """The Go service kept form and request_payload as TEXT (issue 30 item 1): once adopted,
    getModel answers form as JSON and the model receives the payload as it was sent."""
    go_sql = available()[0].sql.replace("JSONB", "TEXT")
    async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
        await conn.execute(go_sql.encode())
        await conn.execute(
            "INSERT INTO asynch_models (model_name, base_url, route, max_concurrency, form)"
            " VALUES ('m', %s, '/gen', 2, '[{\"field\": \"prompt\"}]'),"
            " ('blank', 'http://h', '', 1, '')",
            (model_emu.url,),
        )
        await conn.execute(
            "INSERT INTO asynch_task (task_id, model_name, request_payload) VALUES"
            " ('go-1', 'm', '{\"prompt\": \"a cat\"}'), ('go-2', 'm', 'not json')"
        )
    await migrate(fresh_db)
    storage = StorageSettings(kind="local", local_dir=tmp_path / "files")
    async with (
        await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as db,
        open_asynch(fresh_db, redis_url, db, tmp_path, fast_settings(), storage) as asynch,
    ):
        got = await asynch.ok("GET", "/model/getModel", params={"modelName": "m"})
        assert got["form"] == [{"field": "prompt"}]
        blank = await asynch.ok("GET", "/model/getModel", params={"modelName": "blank"})
        assert blank["form"] == []
        assert (await asynch.ok("POST", "/task/runWork", json={}))["succeeded"] == 2
        echoes = [json.loads((await asynch.row(t))["text"])["echo"] for t in ("go-1", "go-2")]
        assert echoes == [{"prompt": "a cat"}, {"payload": "not json"}]  # kept as a string
        created = await asynch.create_task("m", {"n": 1})  # and new rows go in as JSON
        assert await asynch.wait_state(created, 2) == 2
        cur = await db.execute("SELECT request_payload FROM asynch_task WHERE task_id = %s",
                               (created,))  # fmt: skip
        assert await cur.fetchone() == ({"n": 1},)


GO_CONFIG = """
server:
  address: ":8095"
database:
  default:
    link: "pgsql:asynch:p@ss@tcp(db.internal:5433)/models?sslmode=disable"
redis:
  default:
    address: redis.internal:6379
    db: 2
    pass: secret
asynch:
  worker:
    enabled: true
    intervalSeconds: 3
    batchSize: 20
    goroutines: 2
  cleaner:
    enabled: false
    intervalSeconds: 60
"""


def test_the_go_config_yml_is_read_and_the_environment_wins(tmp_path: Path) -> None:
    path = tmp_path / "config.yml"
    path.write_text(GO_CONFIG)
    env = {"AIGCQ_ASYNCH_CONFIG": str(path), "AIGCQ_ASYNCH_WORKER_BATCH_SIZE": "5"}
    assert goconfig.apply(env) == path
    assert env == {
        "AIGCQ_ASYNCH_CONFIG": str(path),
        "AIGCQ_ASYNCH_HOST": "0.0.0.0",  # Go's ":port": every interface (issue 30 item 1)
        "AIGCQ_ASYNCH_PORT": "8095",
        "AIGCQ_DATABASE_URL": "postgresql://asynch:p%40ss@db.internal:5433/models?sslmode=disable",
        "AIGCQ_REDIS_URL": "redis://:secret@redis.internal:6379/2",
        "AIGCQ_ASYNCH_WORKER_ENABLED": "true",
        "AIGCQ_ASYNCH_WORKER_INTERVAL_SECONDS": "3",
        "AIGCQ_ASYNCH_WORKER_BATCH_SIZE": "5",  # set in the environment: kept
        "AIGCQ_ASYNCH_WORKER_GOROUTINES": "2",
        "AIGCQ_ASYNCH_CLEANER_ENABLED": "false",
        "AIGCQ_ASYNCH_CLEANER_INTERVAL_SECONDS": "60",
    }
    for address, host, port in [
        (":23492", "0.0.0.0", "23492"),
        ("0.0.0.0:8091", "0.0.0.0", "8091"),
        ("127.0.0.1:8091", "127.0.0.1", "8091"),
        ("[::]:8091", "::", "8091"),
        ("[::1]:8091", "::1", "8091"),
    ]:
        expected = {"AIGCQ_ASYNCH_HOST": host, "AIGCQ_ASYNCH_PORT": port}
        assert goconfig.environment({"server": {"address": address}}) == expected, address
    fields = {"host": "pg", "port": 5432, "user": "u", "pass": "", "name": "d"}
    assert goconfig.database_url(fields) == "postgresql://u@pg:5432/d"
    assert goconfig.apply({}) is None or Path("config.yml").is_file()


def test_file_urls_name_this_machine_when_listening_on_every_interface() -> None:
    def url(host: str) -> str:
        return AsynchSettings(host=host, port=8091, public_url="").base_url

    assert url("0.0.0.0") == url("::") == f"http://{socket.gethostname()}:8091"
    assert (url("127.0.0.1"), url("::1")) == ("http://127.0.0.1:8091", "http://[::1]:8091")
    public = AsynchSettings(host="0.0.0.0", public_url="https://asynch.example.com/")
    assert public.base_url == "https://asynch.example.com"
