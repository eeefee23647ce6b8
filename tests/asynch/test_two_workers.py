"""Real worker processes: no task runs twice, max_concurrency holds, SIGKILL loses nothing."""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.fakes.asynch import Served
from tests.fakes.processes import ASYNCH_ADMIN_TOKEN, start_asynch, stop
from tests.fakes.waiting import until

pytestmark = pytest.mark.e2e

FAST = {
    "AIGCQ_ASYNCH_WORKER_INTERVAL_SECONDS": "0.2",
    "AIGCQ_ASYNCH_WORKER_BATCH_SIZE": "10",
    "AIGCQ_ASYNCH_LEASE_SECONDS": "2",
    "AIGCQ_ASYNCH_RUNNING_GRACE_SECONDS": "0",
    "AIGCQ_ASYNCH_GATE_GRACE_SECONDS": "0",
    "AIGCQ_ASYNCH_MODEL_CACHE_SECONDS": "0",
}

ADMIN = {"Authorization": f"Bearer {ASYNCH_ADMIN_TOKEN}"}
Starter = Callable[..., tuple[subprocess.Popen[bytes], str]]


@pytest.fixture
async def workers(
    pg_url: str, redis_url: str, db: Any, redis: Any, tmp_path: Path
) -> AsyncIterator[Starter]:
    procs: list[subprocess.Popen[bytes]] = []
    started = itertools.count()

    def start(**env: str) -> tuple[subprocess.Popen[bytes], str]:
        n = next(started)
        log = tmp_path / f"asynch-{n}.log"
        # every other process runs as an operator may start it: bare `aigcq asynch`
        args = ("serve", "--log-level", "WARNING") if n % 2 == 0 else ()
        proc, url = start_asynch(pg_url, redis_url, tmp_path, log=log, args=args, **{**FAST, **env})
        procs.append(proc)
        return proc, url

    yield start
    for proc in procs:
        stop(proc)


async def _states(db: psycopg.AsyncConnection[Any]) -> dict[int, int]:
    cur = await db.execute("SELECT state, count(*) FROM asynch_task GROUP BY state")
    return dict(await cur.fetchall())  # type: ignore[arg-type]


async def _wait_all_done(db: psycopg.AsyncConnection[Any], n: int, timeout: float) -> None:
    await until(lambda: _states(db), lambda states: states.get(2, 0) >= n, timeout, 0.1)


async def test_two_workers_200_tasks(
    workers: Starter, model_emu: Served, db: Any, redis: Any
) -> None:
    (_, a), (_, b) = await asyncio.gather(asyncio.to_thread(workers), asyncio.to_thread(workers))
    model_emu.app.state.behaviour.latency = 0.02
    async with httpx.AsyncClient(timeout=30, headers=ADMIN) as c:
        model = {"modelName": "m", "baseUrl": model_emu.url, "maxConcurrency": 4,
                 "queueLimit": 1000, "route": "/gen"}  # fmt: skip
        assert (await c.post(f"{a}/model/createModel", json=model)).status_code == 200
        limit = asyncio.Semaphore(20)

        async def create(i: int) -> str:
            body = {"modelName": "m", "requestPayload": {"i": i}, "bizName": "b"}
            async with limit:
                r = await c.post(f"{(a, b)[i % 2]}/task/createTask", json=body)
            return str(r.json()["data"]["task_id"])

        ids = await asyncio.gather(*(create(i) for i in range(200)))
    await _wait_all_done(db, 200, 60)
    stats = await model_emu.stats()
    assert stats["calls"] == 200 and stats["byTask"] == {t: 1 for t in ids}
    assert stats["peak"] <= 4
    assert await redis.zcard("asynch:gate:m") == 0
    assert await redis.zcard("asynch:sem:m:default") == 0
    cur = await db.execute("SELECT sum(request_count) FROM asynch_model_stat")
    assert (await cur.fetchone())[0] == 200


async def test_sigkill_mid_call_loses_nothing(
    workers: Starter, model_emu: Served, db: Any, redis: Any
) -> None:
    victim, a = await asyncio.to_thread(workers)
    await asyncio.to_thread(
        workers, AIGCQ_ASYNCH_CLEANER_ENABLED="true", AIGCQ_ASYNCH_CLEANER_INTERVAL_SECONDS="0.3"
    )
    model_emu.app.state.behaviour.latency = 30
    async with httpx.AsyncClient(timeout=30, headers=ADMIN) as c:
        model = {"modelName": "m", "baseUrl": model_emu.url, "maxConcurrency": 1,
                 "timeoutSeconds": 2, "retryTimes": 2, "route": "/gen"}  # fmt: skip
        assert (await c.post(f"{a}/model/createModel", json=model)).status_code == 200
        body = {"modelName": "m", "requestPayload": {}, "bizName": "b"}
        task_id = (await c.post(f"{a}/task/createTask", json=body)).json()["data"]["task_id"]
    await until(model_emu.stats, lambda s: s["current"] > 0, within=30)  # the victim's call
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    model_emu.app.state.behaviour.latency = 0
    await _wait_all_done(db, 1, 20)
    cur = await db.execute(
        "SELECT state, retry_count, attempt FROM asynch_task WHERE task_id = %s", (task_id,)
    )
    assert await cur.fetchone() == (2, 1, 2)  # failed (timed out), retried, succeeded
    assert (await model_emu.stats())["byTask"] == {task_id: 2}
    assert await redis.zcard("asynch:gate:m") == 0
    assert await redis.zcard("asynch:sem:m:default") == 0
    assert 1 not in await _states(db)
