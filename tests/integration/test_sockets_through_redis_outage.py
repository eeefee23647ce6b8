"""A Redis outage (its server SIGKILLed) as bridges and clients see it: a bridge stays
connected and is still used once Redis is back; a client that connects meanwhile is told
``AssessmentError`` and closed with 1013 (try again later), not dropped."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis
import websockets

from aigcq.config import PlatformConfig, Settings
from aigcq.embedded.redis import EmbeddedRedis
from aigcq.plumbing.auth import issue_client_token
from aigcq.serve.server import ServeProcess
from tests.fakes.bridge import BRIDGE_TOKEN, Bridge
from tests.fakes.client import Client, generate
from tests.fakes.servers import serve_app
from tests.fakes.service import SECRET, Env
from tests.fakes.waiting import until


async def test_bridges_and_clients_ride_out_a_redis_outage(
    tmp_path: Path, private_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}')
    settings = Settings(
        redis_url=private_redis.url,
        token_secret=SECRET,
        config_dir=tmp_path,
        bridge_token=BRIDGE_TOKEN,
    )
    redis = aioredis.Redis.from_url(private_redis.url, decode_responses=True)
    service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
    client_token = issue_client_token(SECRET, "b1")
    hub = service.hub
    assert hub is not None
    async with serve_app(service.app) as base:
        env = Env(int(base.rsplit(":", 1)[1]), redis, service)
        bridge = await Bridge.connect(env.port, BRIDGE_TOKEN)
        await bridge.register(count=2)
        await until(lambda: redis.exists("aigcq:bridge:br1"), bool)

        private_redis.kill()
        await bridge.send("HEARTBEAT", {"instanceCount": 2, "availableInstanceCount": 2})
        await bridge.ws.send("{broken")  # answered without Redis: proves the socket is open
        assert (await bridge.next())["data"]["code"] == "JSONError"
        assert "not handled, Redis unavailable" in caplog.text

        refused = await websockets.connect(f"ws://127.0.0.1:{env.port}/?token={client_token}&id=b1")
        reply = await refused.recv()
        assert '"AssessmentError"' in str(reply)
        await refused.wait_closed()
        assert refused.close_code == 1013

        private_redis.start()
        await until(lambda: redis.ping(), bool, within=10.0)
        assert hub.registry.bridges["br1"].online
        client = await Client(env.port, "b1", client_token).connect()
        await client.request(generate("after"))
        msg = await bridge.next()
        assert msg["type"] == "TASK_ASSIGN" and msg["data"]["taskId"] == "after"
        await client.close()
        await bridge.ws.close()
    await redis.aclose()
