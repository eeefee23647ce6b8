"""Issue 25 item 2 across a restart: RunningHub accepted a create (and bills it), Redis did
not answer, and serve was SIGKILLed before Redis had the remote id. Its journal, fsynced
before the Redis write, is replayed by the serve that starts next on its data dir: the
task's result is found instead of the task failing with ``UncertainSubmit``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from aigcq.embedded.redis import EmbeddedRedis
from tests.fakes.client import AUTH, generate
from tests.fakes.processes import Cluster
from tests.fakes.waiting import until

pytestmark = pytest.mark.e2e

SERVE_ENV = {"AIGCQ_PAID_SILENCE_S": "1", "AIGCQ_HTTP_TIMEOUT_S": "2"}


async def test_an_acceptance_outlives_a_sigkill_before_redis_had_it(tmp_path: Path) -> None:
    redis_server = EmbeddedRedis(tmp_path / "redis", persist=True)
    cluster = Cluster(tmp_path, redis_server.start())
    redis = aioredis.Redis.from_url(cluster.redis_url, decode_responses=True)
    try:
        rh = cluster.emulator("runninghub", "--duration", "0.2")
        models = {"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 2, "deadline_s": 4}}}
        cluster.write_models(models)
        serve, port = cluster.server(AIGCQ_RUNNINGHUB_URL=rh, **SERVE_ENV)
        async with httpx.AsyncClient() as http:
            await http.post(f"{rh}/_emulator/faults", json={"delay_create_reply_s": 1.5})
            task = generate("j1")
            body = {
                "taskId": "j1",
                "platform": "comfyui",
                "AIGC": "proj",
                "payload": task["payload"],
            }
            url = f"http://127.0.0.1:{port}/api/tasks"
            assert (await http.post(url, json=body, headers=AUTH)).status_code == 202

            async def creates() -> list[object]:
                records = (await http.get(f"{rh}/_emulator/records")).json()
                return [c for r in records.values() for c in r["creates"] if c["task"] == "j1"]

            await until(creates, bool, within=20)
            redis_server.stop()  # its webhook, sent now, finds no Redis and is lost
            await asyncio.sleep(2.5)  # time: the create's reply comes, Redis cannot take it
            serve.kill()
            await asyncio.sleep(2.0)  # time: RunningHub's webhook retries run out
            redis_server.start()
            cluster.server(port, AIGCQ_RUNNINGHUB_URL=rh, **SERVE_ENV)
            state = await until(
                lambda: redis.hget("aigcq:task:j1", "status"),
                lambda s: s in ("success", "failed"),
                within=30,
            )
            assert state == "success", await redis.hget("aigcq:task:j1", "error")
            assert len(await creates()) == 1
            assert not list((tmp_path / f"data-{port}" / "accepted").glob("*.jsonl"))
    finally:
        await redis.aclose()
        cluster.close()
        redis_server.stop()
