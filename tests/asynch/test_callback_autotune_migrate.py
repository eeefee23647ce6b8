"""Success callbacks, autoTune on seeded history, migrations, and small pure pieces."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from urllib.parse import parse_qs

import psycopg
import pytest

from aigcq.asynch.autotune import tune
from aigcq.asynch.headmsg import merge_headers
from aigcq.asynch.migrate import available, migrate
from aigcq.storage.sigv4 import authorization
from tests.fakes.asynch import Asynch, Served
from tests.fakes.servers import Recorder, serve_app


async def test_success_callback_is_retried_and_text_cut(asynch: Asynch, model_emu: Served) -> None:
    recorder = Recorder(fail_first=1)
    async with serve_app(recorder.app) as hook:
        await asynch.create_model("m", model_emu.url)
        task_id = await asynch.create_task(
            "m", {"long": "x" * 5000}, callbackUrl=f"{hook}/hooks", bizName="order-1"
        )
        received = await recorder.wait_for(2)
        failed = await asynch.create_task("m", {"_fail": True}, callbackUrl=f"{hook}/hooks")
        await asynch.wait_state(failed, 3)
        await asyncio.sleep(0.2)  # time: a callback for the failure would come now
    assert len(recorder.received) == 2  # the failure sends nothing
    first, second = received
    assert first.method == "GET" and second.path == "/hooks/order-1"
    query = {k: v[0] for k, v in parse_qs(second.query).items()}
    row = await asynch.row(task_id)
    assert query["task_id"] == task_id and query["state"] == "2"
    assert query["oss_file"] == row["oss_file"] and query["file_type"] == "json"
    assert len(query["text"]) == 2000 and row["text"].startswith(query["text"])


async def _seed_history(asynch: Asynch, model: str, n: int, seconds: int, age: str) -> None:
    await asynch.db.execute(
        "INSERT INTO asynch_task (task_id, model_name, request_payload, state,"
        " started_at, finished_at)"
        " SELECT %s || %s || g, %s, '{}', 2 + (g %% 2) * 2,"
        "  now() - %s::interval - make_interval(secs => %s), now() - %s::interval"
        " FROM generate_series(1, %s) g",
        [model, age, model, age, seconds, age, n],
    )


async def test_auto_tune_on_seeded_history(asynch: Asynch) -> None:
    await asynch.create_model("m", "http://h", maxConcurrency=10, queueLimit=100, timeoutSeconds=60)
    await asynch.create_model("capped", "http://h", maxConcurrency=2, queueLimit=5)
    await asynch.create_model("idle", "http://h")
    await _seed_history(asynch, "m", 360, 10, "1 minute")  # 0.1 task/s, 10 s each
    await _seed_history(asynch, "m", 50, 99, "3 hours")  # outside every window used here
    await _seed_history(asynch, "capped", 3600, 20, "1 minute")
    data = await asynch.ok("POST", "/model/autoTune", json={})
    by_model = {m["modelName"]: m for m in data["models"]}
    assert set(by_model) == {"m", "capped"}
    m = by_model["m"]
    assert (m["samples"], m["p90Seconds"], m["throughputPerSecond"]) == (360, 10.0, 0.1)
    # ceil(1.5 · 0.1 · 10) + 1 = 3 ; floor(3 · 60 / 10) = 18
    assert (m["maxConcurrency"], m["queueLimit"]) == (3, 18)
    assert (by_model["capped"]["maxConcurrency"], by_model["capped"]["queueLimit"]) == (2, 5)
    assert await asynch.redis.get("asynch:runtime:max_concurrency:m") == "3"
    assert await asynch.redis.get("asynch:runtime:queue_limit:m") == "18"
    assert 7190 < await asynch.redis.ttl("asynch:runtime:queue_limit:m") <= 7200
    wider = await asynch.ok("POST", "/model/autoTune", json={"windowSeconds": 7200})
    m = {x["modelName"]: x for x in wider["models"]}["m"]
    # 0.05 task/s: ceil(1.5 · 0.05 · 10) + 1 = 2 ; floor(2 · 60 / 10) = 12
    assert (m["maxConcurrency"], m["queueLimit"]) == (2, 12)


def test_tune_formula_edges() -> None:
    assert tune(samples=1, p90=0.0, window=3600, cap_mc=4, cap_ql=9, timeout=60) == (1, 9)
    assert tune(samples=7200, p90=100, window=3600, cap_mc=4, cap_ql=9, timeout=60) == (4, 4)


async def test_migrations_apply_once_in_order(pg_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        await admin.execute("DROP DATABASE IF EXISTS asynch_migrate_test")
        await admin.execute("CREATE DATABASE asynch_migrate_test")
    url = pg_url.replace("/postgres?", "/asynch_migrate_test?")
    versions = [m.version for m in available()]
    assert versions == sorted(versions) and versions[:2] == [1, 2]
    assert await asyncio.gather(migrate(url), migrate(url)) in ([versions, []], [[], versions])
    assert await migrate(url) == []
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SELECT version FROM asynch_schema_migrations ORDER BY 1")
        assert [r[0] for r in await cur.fetchall()] == versions


def test_model_key_overrides_head_msg_case_insensitively() -> None:
    merged = merge_headers("API_KEY:a:b:c, API_STATE:true", "api_key:z")
    assert merged == {"api_key": "z", "API_STATE": "true"}


@pytest.mark.parametrize("value", ["", "  "])
def test_empty_head_msg(value: str) -> None:
    assert merge_headers(value, value) == {}


def test_sigv4_matches_the_aws_example() -> None:
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    header = authorization(
        method="GET",
        path="/test.txt",
        query={},
        headers={
            "Host": "examplebucket.s3.amazonaws.com",
            "Range": "bytes=0-9",
            "x-amz-content-sha256": empty,
            "x-amz-date": "20130524T000000Z",
        },
        payload_hash=empty,
        access_key="AKIAIOSFODNN7EXAMPLE",
        secret_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        region="us-east-1",
        when=datetime(2013, 5, 24, tzinfo=UTC),
    )
    assert header.endswith(
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
