"""Issue 25 item 2, its last piece: a result that arrives later still wins. RunningHub
accepted a create (and bills it) but its reply was lost, and no webhook came by the
deadline: the task failed ``UncertainSubmit``. Then RunningHub's webhook brings the
success: through a real ``aigcq serve`` and the Python SDK, the client gets the failure,
then the success (``late``); the task is a success, billed once. A forged callback, or
one signed for another attempt, is refused with its code and changes nothing; a replay
of the webhook or of the task bills nothing again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from aigcq.client import AsyncClient, Result
from aigcq.embedded.redis import EmbeddedRedis
from aigcq.plumbing.signing import webhook_url
from tests.fakes.client import generate
from tests.fakes.processes import ADMIN_TOKEN, SECRET, Cluster
from tests.fakes.waiting import wait_until

pytestmark = pytest.mark.e2e

TASK = "late1"
#: RunningHub's run outlasts the task's deadline: its webhook comes after the failure
RUN_S = "12"
MODELS = {"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 2, "deadline_s": 2}}}
OUTPUT = {"fileUrl": "http://cdn.example/forged.png", "fileType": "png", "nodeId": "9"}


def task_end(status_code: int = 0) -> dict[str, Any]:
    """A RunningHub TASK_END body (a success unless ``status_code`` says otherwise)."""
    event = {"code": status_code, "msg": "success", "data": [OUTPUT]}
    return {"event": "TASK_END", "taskId": "1" * 19, "eventData": orjson.dumps(event).decode()}


async def results(client: AsyncClient, into: list[Result]) -> None:
    async for event in client.events(TASK):
        if isinstance(event, Result):
            into.append(event)


async def test_a_late_webhook_success_wins_over_uncertain_submit(tmp_path: Path) -> None:
    redis_server = EmbeddedRedis(tmp_path / "redis")
    cluster = Cluster(tmp_path, redis_server.start())
    redis = aioredis.Redis.from_url(cluster.redis_url, decode_responses=True)
    try:
        rh = cluster.emulator("runninghub", "--duration", RUN_S)
        cluster.write_models(MODELS)
        _, port = cluster.server(AIGCQ_RUNNINGHUB_URL=rh, AIGCQ_HTTP_TIMEOUT_S="2")
        base = f"http://127.0.0.1:{port}"
        got: list[Result] = []
        async with (
            httpx.AsyncClient() as http,
            AsyncClient(f"ws://127.0.0.1:{port}/", "e2e-client-token", "late-be") as client,
        ):
            reader = asyncio.create_task(results(client, got))
            await http.post(f"{rh}/_emulator/faults", json={"drop_create_replies": 1})
            frame = generate(TASK)
            await client.submit(frame["platform"], frame["payload"], task_id=TASK, aigc="proj")
            await wait_until(lambda: got, 30, what="the failure")
            assert got[0].status == "failed" and got[0].code == "UncertainSubmit", got
            before = await redis.hgetall(f"aigcq:task:{TASK}")
            timeline = await redis.llen(f"aigcq:timeline:{TASK}")

            # a forged callback, and a validly signed one for an attempt that never ran
            forged = f"{base}/callback/all?t={TASK}&a=1&s={'0' * 32}"
            answer = await http.post(forged, json=task_end())
            assert answer.status_code == 403 and answer.json()["code"] == "SignatureError"
            stale = webhook_url(base, SECRET.encode(), TASK, 2)
            answer = await http.post(stale, json=task_end())
            assert answer.status_code == 410 and answer.json()["code"] == "TaskGone"
            assert await redis.hgetall(f"aigcq:task:{TASK}") == before
            assert await redis.llen(f"aigcq:timeline:{TASK}") == timeline

            # a replay while its paid run may still be out is refused: it would pay again
            admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            retry = f"{base}/api/admin/tasks/{TASK}/retry"
            answer = await http.post(retry, headers=admin)
            assert answer.status_code == 409 and answer.json()["code"] == "TaskNotRetryable"

            # RunningHub's own webhook, after its run: the late success wins
            await wait_until(lambda: len(got) >= 2, 60, what="the late success")
            late = got[1]
            assert late.ok and late.late and late.data, got
            assert OUTPUT["fileUrl"] not in str(late.data)  # RunningHub's result, not ours
            assert (await client.result(TASK)).late  # the SDK answers the success now
            task = await redis.hgetall(f"aigcq:task:{TASK}")
            assert task["status"] == "success"
            assert orjson.loads(task["failedFirst"])["code"] == "UncertainSubmit"
            assert not await redis.zscore("aigcq:replayable", TASK)

            # the same webhook again is acknowledged and changes nothing; a replay is refused
            url = webhook_url(base, SECRET.encode(), TASK, 1)
            answer = await http.post(url, json=task_end())
            assert answer.status_code == 200, answer.text
            answer = await http.post(retry, headers=admin)
            assert answer.status_code == 409 and answer.json()["code"] == "TaskNotRetryable"
            assert (await redis.hgetall(f"aigcq:task:{TASK}"))["resultData"] == task["resultData"]
            records = (await http.get(f"{rh}/_emulator/records")).json()
            creates = [c for r in records.values() for c in r["creates"] if c["task"] == TASK]
            assert len(creates) == 1
            assert sum(r["current"] for r in records.values()) == 0
            assert not await redis.exists("aigcq:orphans:proj:runninghub")
            metrics = (await http.get(f"{base}/metrics")).text
            assert 'aigcq_late_successes_total{aigc="proj",platform="comfyui"' in metrics
            reader.cancel()
        assert [r.status for r in got] == ["failed", "success"]
    finally:
        await redis.aclose()
        cluster.close()
        redis_server.stop()
