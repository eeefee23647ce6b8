"""The cleaner's rules one by one, and the full failed → retried → succeeded path."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.fakes.asynch import Asynch, Served


async def _task(asynch: Asynch, task_id: str, model: str = "m", **cols: Any) -> None:
    names = ["task_id", "model_name", "request_payload", "biz_name", *cols]
    values = ", ".join(["%s"] * len(names))
    await asynch.db.execute(
        f"INSERT INTO asynch_task ({', '.join(names)}) VALUES ({values})",
        [task_id, model, "{}", "b", *cols.values()],
    )


async def _ids(asynch: Asynch) -> set[str]:
    cur = await asynch.db.execute("SELECT task_id FROM asynch_task")
    return {r[0] for r in await cur.fetchall()}


AGO = "now() - interval '1 hour'"


async def _at(asynch: Asynch, task_id: str, **cols: str) -> None:
    sets = ", ".join(f"{k} = {v}" for k, v in cols.items())
    await asynch.db.execute(f"UPDATE asynch_task SET {sets} WHERE task_id = %s", [task_id])


async def test_downloaded_tasks_are_deleted_after_expire_at(asynch: Asynch) -> None:
    await asynch.create_model("m", "http://127.0.0.1:9")
    await _task(asynch, "old", state=4)
    await _task(asynch, "new", state=4)
    await _at(asynch, "old", expire_at=AGO)
    await _at(asynch, "new", expire_at="now() + interval '1 hour'")
    report = await asynch.ok("POST", "/task/cleanWork")
    assert report["deleted_downloaded"] == 1 and await _ids(asynch) == {"new"}


async def test_the_files_of_deleted_tasks_are_deleted(asynch: Asynch) -> None:
    await asynch.create_model("m", "http://127.0.0.1:9")
    storage = asynch.svc.storage
    for name in ("gone", "kept"):
        url = await storage.put(f"asynch/{name}.json", b"{}", "application/json")
        await _task(asynch, name, state=4, oss_file=url)
    await _task(asynch, "elsewhere", state=4, oss_file="https://oss.example/x.json")
    await _at(asynch, "gone", expire_at=AGO)
    await _at(asynch, "elsewhere", expire_at=AGO)
    await _at(asynch, "kept", expire_at="now() + interval '1 hour'")
    report = await asynch.ok("POST", "/task/cleanWork")
    assert (report["deleted_downloaded"], report["files_deleted"]) == (2, 1)
    assert not asynch.svc.local_files.path_of("asynch/gone.json").exists()  # type: ignore[union-attr]
    assert asynch.svc.local_files.path_of("asynch/kept.json").exists()  # type: ignore[union-attr]


async def test_exhausted_failures_are_deleted_after_auto_clean(asynch: Asynch) -> None:
    await asynch.create_model("m", "http://127.0.0.1:9", retryTimes=1, autoCleanSeconds=60)
    await _task(asynch, "done-old", state=3, retry_count=1)
    await _task(asynch, "done-new", state=3, retry_count=1)
    await _at(asynch, "done-old", finished_at=AGO)
    await _at(asynch, "done-new", finished_at="now()")
    report = await asynch.ok("POST", "/task/cleanWork")
    assert report["deleted_failed"] == 1 and await _ids(asynch) == {"done-new"}


async def test_failures_of_a_deleted_model_are_deleted_a_day_later(asynch: Asynch) -> None:
    for task_id in ("old", "recent"):
        await _task(asynch, task_id, model="deleted", state=3)
    await _at(asynch, "old", finished_at="now() - interval '25 hours'")
    await _at(asynch, "recent", finished_at=AGO)
    report = await asynch.ok("POST", "/task/cleanWork")
    assert report["deleted_failed"] == 1 and await _ids(asynch) == {"recent"}


async def test_running_and_queued_tasks_time_out(asynch: Asynch) -> None:
    await asynch.create_model("m", "http://127.0.0.1:9", timeoutSeconds=10)
    asynch.svc.cleaner.queue_timeout = 600
    for task_id in ("run-old", "run-new", "q-old", "q-new"):
        await _task(asynch, task_id, state=1 if task_id.startswith("run") else 0)
        await asynch.redis.zadd("asynch:gate:m", {task_id: 1e10})
    await _at(asynch, "run-old", started_at="now() - interval '11 seconds'", attempt="1")
    await _at(asynch, "run-new", started_at="now()")
    await _at(asynch, "q-old", enqueue_at="now() - interval '601 seconds'")
    await asynch.redis.zadd("asynch:sem:m:", {"run-old:1": 1e10})
    report = await asynch.ok("POST", "/task/cleanWork")
    assert report["timed_out"] == 2
    assert (await asynch.row("run-old"))["state"] == 3
    assert "timed out after 10 s" in (await asynch.row("run-old"))["error"]
    assert (await asynch.row("q-old"))["error"] == "timed out in the queue"
    assert (await asynch.row("run-new"))["state"] == 1 and (await asynch.row("q-new"))["state"] == 0
    assert set(await asynch.redis.zrange("asynch:gate:m", 0, -1)) == {"run-new", "q-new"}
    assert await asynch.redis.zcard("asynch:sem:m:") == 0


async def test_retries_go_to_head_or_tail(asynch: Asynch) -> None:
    await asynch.create_model("head", "http://127.0.0.1:9", retryTimes=2)
    await asynch.create_model("wait", "http://127.0.0.1:9", retryTimes=2, retryQueueMaxSeconds=600)
    await _task(asynch, "h", "head", state=3)
    await _task(asynch, "young", "wait", state=3)
    await _task(asynch, "aged", "wait", state=3)
    await _at(asynch, "aged", created_at="now() - interval '601 seconds'")
    await _task(asynch, "exhausted", "head", state=3, retry_count=2)
    report = await asynch.ok("POST", "/task/cleanWork")
    assert report["requeued"] == 3
    rows = {t: await asynch.row(t) for t in ("h", "young", "aged", "exhausted")}
    assert [rows[t]["state"] for t in ("h", "young", "aged")] == [0, 0, 0]
    assert [rows[t]["retry_count"] for t in ("h", "young", "aged")] == [1, 1, 1]
    assert [rows[t]["priority"] for t in ("h", "young", "aged")] == [1, 0, 1]
    assert rows["exhausted"]["state"] == 3
    assert await asynch.redis.zrange("asynch:gate:wait", 0, -1) in (
        ["young", "aged"], ["aged", "young"]
    )  # fmt: skip


async def test_a_retry_waiting_too_long_jumps_the_queue(asynch: Asynch) -> None:
    await asynch.create_model("m", "http://127.0.0.1:9", retryTimes=2, retryQueueMaxSeconds=60)
    await _task(asynch, "patient", state=0, retry_count=1)
    await _task(asynch, "fresh", state=0, retry_count=1)
    await _task(asynch, "first-try", state=0)
    await _at(asynch, "patient", enqueue_at="now() - interval '61 seconds'")
    await _at(asynch, "first-try", enqueue_at="now() - interval '61 seconds'")
    report = await asynch.ok("POST", "/task/cleanWork")
    assert report["promoted"] == 1
    assert [(await asynch.row(t))["priority"] for t in ("patient", "fresh", "first-try")] == [
        1, 0, 0
    ]  # fmt: skip


async def test_head_of_queue_is_claimed_first(asynch: Asynch, model_emu: Served) -> None:
    await asynch.create_model("m", model_emu.url, maxConcurrency=1)
    await _task(asynch, "older")
    await _task(asynch, "retried", priority=1, retry_count=1)
    assert (await asynch.ok("POST", "/task/runWork", json={"batchSize": 1}))["claimed"] == 1
    assert (await asynch.row("retried"))["state"] == 2
    assert (await asynch.row("older"))["state"] == 0


async def test_every_state_transition(asynch: Asynch, model_emu: Served) -> None:
    """0 → 1 → 3 → (cleaner) 0 → 1 → 2 → (batch) 4 → (cleaner, expired) deleted."""
    await asynch.create_model("m", model_emu.url, retryTimes=1)
    model_emu.app.state.behaviour.latency = 0.3
    model_emu.app.state.behaviour.failure_rate = 1.0
    task_id = await asynch.create_task("m")
    assert (await asynch.row(task_id))["state"] == 1
    await asynch.wait_state(task_id, 3)
    model_emu.app.state.behaviour.failure_rate = 0.0
    await asynch.ok("POST", "/task/cleanWork")
    assert (await asynch.row(task_id))["state"] == 0
    run = asyncio.create_task(asynch.ok("POST", "/task/runWork"))
    await asynch.wait_state(task_id, 1)
    assert (await run)["succeeded"] == 1
    row = await asynch.row(task_id)
    assert (row["state"], row["retry_count"], row["attempt"]) == (2, 1, 2)
    assert (await model_emu.stats())["byTask"] == {task_id: 2}
    batch = await asynch.ok("POST", "/task/getTaskBatch", json={"taskIds": [task_id]})
    assert batch[0]["state"] == 4
    expired = "UPDATE asynch_task SET expire_at = now() WHERE task_id = %s"  # retention over
    await asynch.db.execute(expired, (task_id,))
    assert (await asynch.ok("POST", "/task/cleanWork"))["deleted_downloaded"] == 1
    await asynch.error("GET", "/task/getTaskResult", "TASK_NOT_FOUND", params={"taskId": task_id})
