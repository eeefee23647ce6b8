"""Issue 15 item 10: a reply lost on the hot-path Redis connection (the request ran, its
answer never came back) must not be taken for "nothing happened"."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.gateway.errors import ClientError
from aigcq.gateway.submission import GenerateRequest
from aigcq.plumbing.redis_client import redis_client
from aigcq.serve.server import ServeProcess
from tests.fakes.fault_proxy import fault_proxy


async def test_a_submit_whose_reply_was_lost_keeps_the_quota_unit_of_its_task(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}')
    settings = Settings(
        token_secret="s" * 32, config_dir=tmp_path, admission="quota", admission_quota=5
    )
    async with fault_proxy(redis_url) as proxy:
        client = redis_client(proxy.url + "?socket_timeout=0.5")
        service = ServeProcess(settings, PlatformConfig.load(tmp_path), client)
        try:
            first = GenerateRequest(taskId="first", platform="comfyui", payload={}, AIGC="proj")
            submit = service.gateway.submission.submit
            await submit(first, "b1", deliver=True, principal="b1")  # script loaded
            proxy.lose_replies_after(b"lost-reply-task")  # the submit script's argument
            req = first.model_copy(update={"taskId": "lost-reply-task"})
            with pytest.raises(ClientError) as refused:
                await submit(req, "b1", deliver=True, principal="b1")
            assert refused.value.code == "AssessmentError"
            assert proxy.lost.is_set()
        finally:
            await service.rt.store.aclose()
            await client.aclose()
    # The task exists (the script ran): its unit stays spent, no free task.
    assert await redis.hget("aigcq:task:lost-reply-task", "status") == "pending"
    assert await redis.get("aigcq:quota:b1") == "3"
