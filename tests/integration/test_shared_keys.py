"""Issue 42 item 6: one RunningHub key configured for two projects is one account, with
one cap over both (claims and hand-overs alike), on a real Redis through the serve
process's own runtime."""

from __future__ import annotations

from pathlib import Path

import orjson
import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.serve.server import runtime

KEY = "k" * 32
PAYLOAD = {"workflowId": "1", "nodeInfoList": []}


async def test_two_projects_on_one_key_share_its_cap(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    models = {
        "a": {"comfyui": {"apikey": KEY, "concurrency": 2}},
        "b": {"comfyui": {"apikey": KEY, "concurrency": 2}},
        "solo": {"comfyui": {"apikey": "s" * 32, "concurrency": 2}},
    }
    (tmp_path / "model.json").write_text(orjson.dumps(models).decode())
    settings = Settings(redis_url=redis_url, config_dir=tmp_path, token_secret="x" * 32)
    rt = runtime(settings, PlatformConfig.load(tmp_path), redis)
    store = rt.store
    try:
        for aigc in ("a", "b", "solo"):
            for i in range(3):
                await store.submit(f"{aigc}{i}", aigc=aigc, platform="comfyui",
                                   backend_id="c", payload=PAYLOAD)  # fmt: skip
        claim = {"cap": 2, "n": 3, "deadline_s": 60}
        assert len(await store.claim("a", "comfyui", "runninghub", **claim)) == 2
        # b's own cap leaves it 2, the account it shares with a has none left
        assert await store.claim("b", "comfyui", "runninghub", **claim) == []
        [bridge] = await store.claim("b", "comfyui", "bridge", cap=-1, n=1, deadline_s=60)
        handed = await store.retarget(
            bridge.task_id, bridge.attempt, "bridge", "runninghub", cap=2, deadline_s=60
        )
        assert handed == 0  # a hand-back from our GPUs finds the account full too
        assert len(await store.claim("solo", "comfyui", "runninghub", **claim)) == 2
    finally:
        await store.aclose()
        await rt.platforms.aclose()
