"""Task endpoints end to end against the model emulator: states, headers, results, stats."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from aigcq.asynch.settings import AsynchSettings
from aigcq.storage import StorageSettings
from tests.fakes.asynch import USER, Asynch, Served, open_asynch


async def test_json_result_head_msg_and_model_key(asynch: Asynch, model_emu: Served) -> None:
    await asynch.create_model("m", model_emu.url, headMsg="API_KEY:cfg,API_NUM:123,X-Keep:1")
    task_id = await asynch.create_task("m", {"prompt": "cat"}, modelKey="api_key:dyn,X-New:n")
    assert await asynch.wait_state(task_id, 2) == 2
    result = await asynch.ok("GET", "/task/getTaskResult", params={"taskId": task_id})
    assert result["state"] == 2 and result["file_type"] == "json"
    echoed = json.loads(result["text"])
    assert echoed["echo"] == {"prompt": "cat"} and echoed["path"] == "/gen"
    headers = echoed["headers"]
    assert headers["api_key"] == "dyn" and headers["api_num"] == "123"
    assert headers["x-keep"] == "1" and headers["x-new"] == "n"
    assert headers["x-asynch-task-id"] == task_id
    async with httpx.AsyncClient() as c:  # the local storage serves the file
        stored = await c.get(result["oss_file"])
    assert stored.status_code == 200 and stored.json()["echo"] == {"prompt": "cat"}


async def test_get_method_and_image_result(asynch: Asynch, model_emu: Served) -> None:
    await asynch.create_model("m", model_emu.url, httpMethod="GET")
    task_id = await asynch.create_task("m", {"prompt": "dog", "n": 2, "_response": "image"})
    await asynch.wait_state(task_id, 2)
    row = await asynch.row(task_id)
    assert row["file_type"] == "png" and row["text"] is None
    assert row["oss_file"].endswith(f"/asynch/{task_id}.png")


async def test_batch_moves_success_to_downloaded(asynch: Asynch, model_emu: Served) -> None:
    await asynch.create_model("m", model_emu.url, autoCleanSeconds=120)
    ok_id = await asynch.create_task("m")
    bad_id = await asynch.create_task("m", {"_fail": True})
    await asynch.wait_state(ok_id, 2)
    await asynch.wait_state(bad_id, 3)
    before = datetime.now(UTC)
    response = await asynch.call("POST", "/task/getTaskBatch",
                                 json={"taskIds": [bad_id, "missing", ok_id, bad_id]})  # fmt: skip
    reply = response.json()
    # the seed's shape: data is the list of tasks (in the order asked), as a Go caller's
    # []TaskResult decodes it (issue 30 item 1); the unknown ids beside it
    assert [t["task_id"] for t in reply["data"]] == [bad_id, ok_id]
    assert reply["not_found"] == ["missing"]
    by_id = {t["task_id"]: t for t in reply["data"]}
    assert by_id[ok_id]["state"] == 4 and by_id[ok_id]["oss_file"]
    expire = datetime.fromisoformat(by_id[ok_id]["expire_at"])
    assert before + timedelta(seconds=110) < expire < before + timedelta(seconds=130)
    assert by_id[bad_id]["state"] == 3 and "HTTP 500" in by_id[bad_id]["error"]
    again = await asynch.ok("POST", "/task/getTaskBatch", json={"taskIds": [ok_id]})
    assert again[0]["expire_at"] == by_id[ok_id]["expire_at"]


async def test_stats_count_real_model_calls_only(asynch: Asynch, model_emu: Served) -> None:
    await asynch.create_model("m", model_emu.url)
    await asynch.create_model("down", "http://127.0.0.1:9")
    ids = [await asynch.create_task("m", headers=USER) for _ in range(3)]
    ids.append(await asynch.create_task("m", {"_fail": True}, headers=USER))
    ids.append(await asynch.create_task("down", headers=USER))
    for task_id in ids:
        await asynch.wait_state(task_id, 2, 3)
    cur = await asynch.db.execute(
        "SELECT day, tenant_id, creator, model_name, request_count FROM asynch_model_stat"
    )
    rows = await cur.fetchall()
    assert [r[1:] for r in rows] == [("t1", "alice", "m", 4)]
    assert rows[0][0] == datetime.now(UTC).date() or rows[0][0]
    error = (await asynch.row(ids[-1]))["error"]
    assert error == "cannot connect to http://127.0.0.1:9/gen: Connection refused"


async def test_a_model_call_that_times_out_says_so(asynch: Asynch, model_emu: Served) -> None:
    await asynch.create_model("m", model_emu.url, timeoutSeconds=1)
    task_id = await asynch.create_task("m", {"_latency": 3})
    await asynch.wait_state(task_id, 3)
    error = (await asynch.row(task_id))["error"]
    assert error == f"POST {model_emu.url}/gen: no complete reply within 1 s"


async def test_queued_task_starts_when_a_slot_frees(asynch: Asynch, model_emu: Served) -> None:
    await asynch.create_model("m", model_emu.url, maxConcurrency=1)
    model_emu.app.state.behaviour.latency = 0.3
    first = await asynch.create_task("m")
    second = await asynch.create_task("m")
    assert (await asynch.row(first))["state"] == 1
    assert (await asynch.row(second))["state"] == 0
    await asynch.wait_state(second, 2)  # the directed poll picked it up
    assert (await model_emu.stats())["peak"] == 1


async def test_run_work_claims_the_backlog(asynch: Asynch, model_emu: Served) -> None:
    await asynch.create_model("m", model_emu.url, maxConcurrency=10)
    await asynch.db.execute(
        "INSERT INTO asynch_task (task_id, model_name, request_payload, biz_name)"
        " SELECT 'bk' || g, 'm', '{}', 'biz' FROM generate_series(1, 5) g"
    )
    data = await asynch.ok("POST", "/task/runWork", json={"batchSize": 3})
    assert data == {"claimed": 3, "succeeded": 3, "failed": 0}
    data = await asynch.ok("POST", "/task/runWork", json={})
    assert data == {"claimed": 2, "succeeded": 2, "failed": 0}
    assert (await asynch.ok("POST", "/task/runWork", json={}))["claimed"] == 0


OK = {"modelName": "m", "requestPayload": {}, "bizName": "b"}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"modelName": "nope", "requestPayload": {}, "bizName": "b"}, "MODEL_NOT_FOUND"),
        ({"modelName": "M", "requestPayload": {}, "bizName": "b"}, "MODEL_NOT_FOUND"),
        ({**OK, "bizName": 7}, "INVALID_ARGUMENT"),
        ({**OK, "bizName": ["b"]}, "INVALID_ARGUMENT"),
        ({**OK, "bizName": {"b": 1}}, "INVALID_ARGUMENT"),
        ({**OK, "bizName": True}, "INVALID_ARGUMENT"),
        ({**OK, "bizName": None}, "INVALID_ARGUMENT"),
        ({"modelName": "off", "requestPayload": {}, "bizName": "b"}, "MODEL_DISABLED"),
        ({"modelName": "m", "bizName": "b"}, "INVALID_ARGUMENT"),
        ({"modelName": "m", "requestPayload": {}}, "INVALID_ARGUMENT"),
        ({**OK, "modelKey": "x"}, "INVALID_HEAD_MSG"),
        ({**OK, "modelKey": "X-Key:k,Transfer-Encoding:chunked"}, "INVALID_HEAD_MSG"),
        ({**OK, "callbackUrl": "ftp:/x"}, "INVALID_ARGUMENT"),
        ({**OK, "requestPayload": "x" * (1 << 20)}, "PAYLOAD_TOO_LARGE"),
    ],
)  # fmt: skip
async def test_bad_task_input_changes_nothing(
    asynch: Asynch, model_emu: Served, body: dict[str, object], code: str
) -> None:
    """Nothing: no row of any table (a task, a day's model count), nothing in Redis (the
    queue-limit gate, a semaphore), with a task of the model done before (issue 42 item 8)."""
    await asynch.create_model("m", model_emu.url)
    await asynch.create_model("off", model_emu.url, enabled=0)
    await asynch.run_one("m")
    before = await asynch.snapshot()
    await asynch.error("POST", "/task/createTask", code, json=body)
    assert await asynch.snapshot() == before


async def test_unknown_task_ids(asynch: Asynch) -> None:
    await asynch.error("GET", "/task/getTaskResult", "TASK_NOT_FOUND", params={"taskId": "x"})
    await asynch.error("GET", "/task/getTaskResult", "INVALID_ARGUMENT")
    response = await asynch.call("POST", "/task/getTaskBatch", json={"taskIds": ["a", "b"]})
    assert response.json() == {"code": 0, "message": "success", "data": [], "not_found": ["a", "b"]}
    await asynch.error("POST", "/task/getTaskBatch", "INVALID_ARGUMENT", json={"taskIds": []})
    await asynch.error("POST", "/task/getTaskBatch", "INVALID_ARGUMENT", content=b"{not json")


async def test_unknown_endpoints_and_methods_answer_in_the_envelope(asynch: Asynch) -> None:
    message = await asynch.error("GET", "/task/nope", "NOT_FOUND")
    assert "/task/nope" in message
    await asynch.error("GET", "/task/createTask", "METHOD_NOT_ALLOWED")
    for path in ("/healthz", "/health"):
        assert await asynch.ok("GET", path) == {"status": "ok"}


@pytest.mark.parametrize(
    ("route", "change", "code"),
    [
        ("/model/deleteModel", {}, "MODEL_NOT_FOUND"),
        ("/model/updateModel", {"enabled": 0}, "MODEL_DISABLED"),
    ],
)
async def test_a_model_changed_on_another_process_is_refused_there_and_leaves_nothing(
    asynch: Asynch,
    model_emu: Served,
    pg_url: str,
    redis_url: str,
    tmp_path: Path,
    asynch_settings: AsynchSettings,
    storage_settings: StorageSettings,
    route: str,
    change: dict[str, object],
    code: str,
) -> None:
    """Two processes on one database: the other still holds the model's config in its
    cache (AIGCQ_ASYNCH_MODEL_CACHE_SECONDS) when this one deletes or disables the model. A
    createTask there is refused as here and leaves no row (issue 42 item 8): the insert is
    decided against the model's row, not the cache."""
    await asynch.create_model("m", model_emu.url)
    cached = asynch_settings.model_copy(update={"model_cache_seconds": 3600.0})
    async with open_asynch(
        pg_url, redis_url, asynch.db, tmp_path / "other", cached, storage_settings
    ) as other:
        await other.run_one("m")  # its config now cached there
        await asynch.ok("POST", route, json={"modelName": "m", **change})
        before = await asynch.snapshot()
        await other.error("POST", "/task/createTask", code, json=OK)
        assert await asynch.snapshot() == before
