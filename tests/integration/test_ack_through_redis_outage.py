"""Issue 25 item 8: a result is sent again only when its delete may not have happened. A
client's ``ack`` that arrives while Redis does not answer is kept by its connection and
applied once Redis is back, so the entry is not sent again at the client's next connect
(it used to stay in the outbox, and each later connection sent it once more)."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.domain import TaskState
from aigcq.embedded.redis import EmbeddedRedis
from aigcq.plumbing.auth import issue_client_token
from aigcq.serve.server import ServeProcess
from tests.fakes.client import Client
from tests.fakes.servers import serve_app
from tests.fakes.service import SECRET
from tests.fakes.waiting import until


async def test_an_ack_refused_for_want_of_redis_is_applied_once_redis_is_back(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}')
    settings = Settings(
        redis_url=private_redis.url, token_secret=SECRET, config_dir=tmp_path, sweep_interval_s=0.1
    )
    redis = aioredis.Redis.from_url(private_redis.url, decode_responses=True)
    service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
    store = service.rt.store
    try:
        async with serve_app(service.app) as base:
            client = Client(int(base.rsplit(":", 1)[1]), "b1", issue_client_token(SECRET, "b1"))
            client.url += "&ack=1"
            await client.connect()
            await store.submit("t1", aigc="proj", platform="comfyui", backend_id="b1", payload={})
            await store.finish("t1", TaskState.SUCCESS, result={"n": 1}, message={"n": 1})
            await client.collect(1)
            [result] = client.results["t1"]
            private_redis.stop()
            refused = await client.request({"type": "ack", "id": result["id"]})
            assert refused["code"] == "AssessmentError"
            private_redis.start()
            await until(lambda: redis.xlen("aigcq:outbox:b1"), lambda n: n == 0, within=10)
            await client.close()
    finally:
        await redis.aclose()
