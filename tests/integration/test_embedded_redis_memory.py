"""The embedded Redis of ``aigcq up`` keeps a task's hash compact with a real payload in it
(docs/operations.md, Sizing): Redis's default keeps only values of 64 bytes compact."""

from __future__ import annotations

from pathlib import Path

from aigcq.domain import Ordering
from aigcq.embedded.redis import EmbeddedRedis
from aigcq.plumbing.redis_client import redis_client
from aigcq.queue.store import TaskStore


async def test_a_waiting_task_with_a_real_payload_keeps_a_compact_hash(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis", persist=False)
    redis = redis_client(server.start())
    try:
        store = TaskStore(redis, "e", retention_s=60, outbox_retention_s=60)
        prompt = "a lighthouse on a cliff at dusk, volumetric light, 35 mm film grain " * 6
        payload = {"workflowId": "wf", "nodeInfoList": [{"nodeId": "6", "fieldName": "text",
                                                         "fieldValue": prompt}]}  # fmt: skip
        await store.submit("t1", aigc="p", platform="comfyui", backend_id="b", payload=payload,
                           ordering=Ordering())  # fmt: skip
        assert await redis.object("encoding", "e:task:t1") in ("ziplist", "listpack")
    finally:
        await redis.aclose()
        server.stop()
