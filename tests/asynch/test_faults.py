"""Faults with a real PostgreSQL and Redis that the tests stop, restart or empty, and model
services that misbehave: exactly one callback, one model call and one upload per result."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis.asyncio as aioredis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from aigcq.asynch.rebuild import RUN_ID_KEY
from aigcq.asynch.settings import AsynchSettings
from aigcq.embedded.postgres import EmbeddedPostgres
from aigcq.embedded.redis import EmbeddedRedis
from aigcq.storage import StorageSettings
from tests.fakes.asynch import Asynch, Served, fast_settings, open_asynch
from tests.fakes.processes import start_asynch, stop
from tests.fakes.servers import Recorder, serve_app
from tests.fakes.waiting import until, wait_until


async def _calling(model_emu: Served, count: int = 1) -> None:
    """Wait until the model service is answering ``count`` calls."""
    await until(model_emu.stats, lambda s: s["current"] >= count, within=10)


# ---- 1: the callback follows from durable state ------------------------------------------


async def test_success_callback_survives_redis_failing_as_the_task_finishes(
    pg_url: str,
    db: psycopg.AsyncConnection[Any],
    private_redis: EmbeddedRedis,
    model_emu: Served,
    tmp_path: Path,
) -> None:
    recorder = Recorder()
    async with serve_app(recorder.app) as hook:
        redis = aioredis.Redis.from_url(private_redis.url)
        await redis.set(RUN_ID_KEY, "test")
        await redis.aclose()
        storage = StorageSettings(kind="local", local_dir=tmp_path / "files")
        settings = fast_settings(callback_poll_seconds=0.1)
        async with open_asynch(
            pg_url, private_redis.url, db, tmp_path, settings, storage
        ) as asynch:
            await asynch.create_model("m", model_emu.url)
            task_id = await asynch.create_task("m", {"_latency": 0.6}, callbackUrl=f"{hook}/hooks")
            await _calling(model_emu)
            private_redis.stop()  # the slots cannot be freed as the task finishes
            try:
                await asynch.wait_state(task_id, 2)
                received = await recorder.wait_for(1, within=5)
                await asyncio.sleep(0.3)  # time: a second callback would come now
            finally:
                private_redis.start()
    assert len(recorder.received) == 1 and received[0].path == "/hooks/biz"
    assert f"task_id={task_id}" in received[0].query
    cur = await db.execute("SELECT count(*) FROM asynch_callback")
    assert (await cur.fetchone()) == (0,)  # delivered rows are gone


async def test_owed_callbacks_are_sent_after_a_restart_and_given_up_visibly(
    asynch: Asynch,
) -> None:
    ok, failing = Recorder(), Recorder(fail_first=100)
    async with serve_app(ok.app) as ok_url, serve_app(failing.app) as bad_url:
        # owed by a process that stopped before sending (rows as the finish writes them)
        await asynch.db.execute(
            "INSERT INTO asynch_callback (task_id, url, params) VALUES"
            ' (\'t1\', %s, \'{"task_id": "t1", "state": "2"}\'),'
            ' (\'t2\', %s, \'{"task_id": "t2", "state": "2"}\')',
            (f"{ok_url}/b", f"{bad_url}/b"),
        )
        asynch.svc.callbacks.wake()
        (got,) = await ok.wait_for(1)
        assert got.query == "task_id=t1&state=2"
        attempts = asynch.svc.settings.callback_attempts
        await failing.wait_for(attempts, within=10)
        counts = await until(asynch.svc.callbacks.counts, lambda c: c["failed"] == 1, within=5)
    assert counts == {"owed": 0, "failed": 1}
    assert len(failing.received) == attempts and len(ok.received) == 1
    metrics = (await asynch.call("GET", "/metrics")).text
    assert 'aigcq_asynch_callbacks{state="failed"} 1.0' in metrics


class _CountingPool:
    """The service's pool, counting the connections its callback sender takes."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.checkouts = 0

    def connection(self) -> Any:
        self.checkouts += 1
        return self.pool.connection()


async def test_delivered_callbacks_are_deleted_together_not_one_statement_each(
    asynch: Asynch,
) -> None:
    callbacks = asynch.svc.callbacks
    counting = _CountingPool(callbacks.pool)
    callbacks.pool = counting  # type: ignore[assignment]
    ok = Recorder()
    async with serve_app(ok.app) as url:
        await asynch.db.execute(
            "INSERT INTO asynch_callback (task_id, url, params)"
            " SELECT 't' || g, %s, '{}' FROM generate_series(1, 60) g",
            (f"{url}/b",),
        )
        callbacks.wake()
        await ok.wait_for(60, within=10)
        await until(callbacks.counts, lambda c: c["owed"] == 0, within=5)
    assert await callbacks.counts() == {"owed": 0, "failed": 0}
    assert counting.checkouts < 20  # one per claim and per delete batch, not per callback


# ---- 2: a PostgreSQL outage retries the finishing write, not the attempt ------------------


@pytest.fixture
def storage_settings(oss_emu: Served) -> StorageSettings:
    return StorageSettings(kind="oss", oss_url=oss_emu.url)


async def test_postgres_restart_while_finishing_calls_and_uploads_once(
    asynch: Asynch,
    pg_server: EmbeddedPostgres,
    model_emu: Served,
    oss_emu: Served,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="aigcq")
    await asynch.create_model("m", model_emu.url)
    task_id = await asynch.create_task("m", {"_latency": 0.5})
    await _calling(model_emu)
    await asynch.db.close()
    pg_server.stop()  # the result arrives and is uploaded while PostgreSQL is down
    try:  # until the finished task's write has met the outage
        failed = f"task {task_id}: recording attempt 1 failed"
        await wait_until(lambda: failed in caplog.text, 15)
    finally:
        pg_server.start()
    asynch.db = await psycopg.AsyncConnection.connect(pg_server.url, autocommit=True)
    try:
        await asynch.wait_state(task_id, 2, timeout=15)
        row = await asynch.row(task_id)
    finally:
        await asynch.db.close()
    assert (await model_emu.stats())["byTask"] == {task_id: 1}
    assert len(oss_emu.app.state.oss.uploads) == 1
    assert row["attempt"] == 1 and row["oss_file"].startswith(oss_emu.url)


# ---- 3: a dead holder's task is reclaimed at once, without using a retry -----------------


async def test_a_killed_workers_task_is_reclaimed_without_a_retry(
    asynch: Asynch, pg_url: str, redis_url: str, model_emu: Served, tmp_path: Path
) -> None:
    await asynch.create_model("m", model_emu.url, timeoutSeconds=600, retryTimes=0)
    model_emu.app.state.behaviour.latency = 60.0
    proc, url = start_asynch(
        pg_url, redis_url, tmp_path / "a", log=tmp_path / "a.log",
        AIGCQ_ASYNCH_LEASE_SECONDS="1",
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=url) as other:
            body = {"modelName": "m", "requestPayload": {"p": 1}, "bizName": "b"}
            task_id = (await other.post("/task/createTask", json=body)).json()["data"]["task_id"]
        await _calling(model_emu)
    finally:
        proc.kill()  # the worker dies mid-call
        proc.wait()
        stop(proc)
    model_emu.app.state.behaviour.latency = 0.0
    started = asyncio.get_running_loop().time()
    await asynch.wait_state(task_id, 2, timeout=10)  # reclaimed by this process's reaper
    took = asyncio.get_running_loop().time() - started
    row = await asynch.row(task_id)
    assert row["retry_count"] == 0 and row["attempt"] == 2
    assert took < 8  # lease (1 s, or this process's 2 s) and two looks, not timeoutSeconds


# ---- 4: Redis lost its data: limits rebuilt from PostgreSQL before admitting work --------


@pytest.mark.parametrize("how", ["flush", "restart"])
async def test_limits_hold_after_redis_comes_back_empty(
    how: str,
    pg_url: str,
    db: psycopg.AsyncConnection[Any],
    tmp_path: Path,
    model_emu: Served,
) -> None:
    server = EmbeddedRedis(tmp_path / "redis", persist=False)
    server.start()
    storage = StorageSettings(kind="local", local_dir=tmp_path / "files")
    try:
        async with open_asynch(pg_url, server.url, db, tmp_path, fast_settings(), storage) as a:
            await a.create_model("m", model_emu.url, queueLimit=2, maxConcurrency=1)
            model_emu.app.state.behaviour.latency = 2.0
            running = await a.create_task("m")
            queued = await a.create_task("m")
            await a.error("POST", "/task/createTask", "QUEUE_FULL", json={
                "modelName": "m", "requestPayload": {}, "bizName": "b"})  # fmt: skip
            await _calling(model_emu)
            if how == "flush":
                await a.redis.flushall()
            else:
                server.stop()
                server.start()
            await a.error("POST", "/task/createTask", "QUEUE_FULL", json={
                "modelName": "m", "requestPayload": {}, "bizName": "b"})  # fmt: skip
            assert await a.redis.zcard("asynch:gate:m") == 2
            assert await a.redis.zcard("asynch:sem:m:default") == 1
            claimed = await a.ok("POST", "/task/runWork", json={"batchSize": 5})
            assert claimed["claimed"] == 0  # the running task's lease was rebuilt
            assert (await model_emu.stats())["peak"] == 1
            model_emu.app.state.behaviour.latency = 0.0
            await a.wait_state(running, 2, timeout=5)
            await a.wait_state(queued, 2, timeout=5)
    finally:
        server.stop()


# ---- 5, 6: the whole call is bounded in time and size; a 200 is not always a result ------


@pytest.fixture
def asynch_settings() -> AsynchSettings:
    return fast_settings(reply_max_bytes=100_000)


async def test_timeout_bounds_a_slow_drip(asynch: Asynch, model_emu: Served) -> None:
    await asynch.create_model("m", model_emu.url, timeoutSeconds=1)
    started = asyncio.get_running_loop().time()
    task_id = await asynch.create_task("m", {"_response": "drip", "_dripSeconds": 0.3})
    await asynch.wait_state(task_id, 3, timeout=5)
    assert asyncio.get_running_loop().time() - started < 2.5
    assert "no complete reply within 1 s" in (await asynch.row(task_id))["error"]


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_reply_over_the_size_limit_fails(
    asynch: Asynch, model_emu: Served, chunked: bool
) -> None:
    await asynch.create_model("m", model_emu.url)
    payload = {"_response": "oversize", "_size": 300_000, "_chunked": chunked}
    task_id = await asynch.create_task("m", payload)
    await asynch.wait_state(task_id, 3)
    row = await asynch.row(task_id)
    assert "larger than the limit of 100000 bytes" in row["error"] and row["oss_file"] is None
    fits = await asynch.create_task("m", {**payload, "_size": 50_000})
    await asynch.wait_state(fits, 2)


@pytest.mark.parametrize(
    ("kind", "error"),
    [("garbage", "invalid JSON"), ("empty", "empty body")],
)
async def test_a_200_without_a_result_fails(
    asynch: Asynch, model_emu: Served, kind: str, error: str
) -> None:
    await asynch.create_model("m", model_emu.url)
    task_id = await asynch.create_task("m", {"_response": kind})
    await asynch.wait_state(task_id, 3)
    assert error in (await asynch.row(task_id))["error"]
    stat = await asynch.db.execute("SELECT sum(request_count) FROM asynch_model_stat")
    assert (await stat.fetchone()) == (1,)  # a model call all the same


async def test_the_declared_response_schema_is_followed(asynch: Asynch, model_emu: Served) -> None:
    schema = '{"type": "object", "required": ["echo"], "properties": {"path": {"enum": ["/gen"]}}}'
    await asynch.db.execute(
        "INSERT INTO asynch_models_type (type_id, type, response_json_schema) VALUES"
        " (1, 'chat', %s), (2, 'plain', '')",
        (schema,),
    )
    await asynch.create_model("m", model_emu.url, modelsType="1,2")
    await asynch.create_model("other", model_emu.url, route="/other", modelsType="1")
    good = await asynch.create_task("m")
    bad = await asynch.create_task("other")
    text = await asynch.create_task("m", {"_response": "text"})  # not JSON at all
    assert await asynch.wait_state(good, 2, 3) == 2
    await asynch.wait_state(bad, 3)
    await asynch.wait_state(text, 3)
    assert "$.path is not one of ['/gen']" in (await asynch.row(bad))["error"]
    assert "invalid JSON" in (await asynch.row(text))["error"]


async def test_a_reply_holding_nul_characters_is_stored(asynch: Asynch) -> None:
    async def nul(request: Request) -> Response:
        status = 500 if "fail" in request.url.path else 200
        return Response(b"a\x00b", status, media_type="text/plain")

    app = Starlette(routes=[Route("/{path:path}", nul, methods=["POST"])])
    async with serve_app(app) as url:
        await asynch.create_model("m", url)
        await asynch.create_model("f", url, route="/fail")
        ok, failed = await asynch.create_task("m"), await asynch.create_task("f")
        await asynch.wait_state(ok, 2)
        await asynch.wait_state(failed, 3)
    assert (await asynch.row(ok))["text"] == "a\ufffdb"
    assert (await asynch.row(failed))["error"].endswith("a\ufffdb")
