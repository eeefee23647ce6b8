"""Issue 28 item 6: what JimuAI's get-result answers do to a task, through a real service
and the JimuAI emulator (Volcengine-signed, polled)."""

from __future__ import annotations

from pathlib import Path

import httpx
import redis.asyncio as aioredis

from tests.fakes.client import generate
from tests.fakes.paid import jimuai_account, jimuai_config, paid_stack


def jimu_job(task_id: str) -> dict[str, object]:
    return generate(task_id, platform="jimuai", prompt=f"a fox {task_id}")


MODEL = {"proj": {"jimuai": jimuai_account()}}


async def test_a_post_generation_review_on_get_result_is_retried(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    # 50511 "Post Img Risk Not Pass" is documented as worth another try; it comes only
    # on get-result, once the images exist: a new attempt, not a failure
    async with paid_stack(tmp_path, redis, redis_url, model=MODEL, jm=jimuai_config()) as env:
        await env.inject("post_review")
        await env.client.request(jimu_job("rev"))
        await env.client.collect(1, timeout=20)
        [result] = env.client.results["rev"]
        assert result["status"] == "success", result
        seen = await env.jimu_stats()
        assert (seen["accepted"], seen["code_50511"]) == (2, 1)


async def test_a_task_jimuai_does_not_know_fails_at_once_and_is_not_paid_again(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    # not_found for a task it accepted: "no such task, or older than 12 h". A new create
    # would be billed and most likely lost the same way: it fails at its first not_found,
    # not after polling to the deadline and sending it again at each one
    async with paid_stack(
        tmp_path, redis, redis_url, model=MODEL, jm=jimuai_config(duration_s=5)
    ) as env:
        await env.inject("not_found", 10_000)
        await env.client.request(jimu_job("gone"))
        await env.client.collect(1, timeout=20)
        [result] = env.client.results["gone"]
        assert result["status"] == "failed"
        assert result["error"]["code"] == "JIMUAI_NOT_FOUND", result
        seen = await env.jimu_stats()
        assert (seen["submits"], seen["polls"]) == (1, 1)
        # its slot is free at once: the next task is sent
        await env.inject("clear")
        await env.client.request(jimu_job("next"))
        await env.client.collect(2, timeout=20)
        assert env.client.results["next"][0]["status"] == "success"


async def test_result_urls_are_jpeg_files_as_documented(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with paid_stack(tmp_path, redis, redis_url, model=MODEL, jm=jimuai_config()) as env:
        await env.client.request(jimu_job("jpg"))
        await env.client.collect(1, timeout=20)
        [entry] = env.client.results["jpg"][0]["data"]["data"]
        assert entry["fileType"] == "jpeg"
        async with httpx.AsyncClient() as http:
            image = await http.get(entry["fileUrl"])
        assert image.headers["content-type"] == "image/jpeg"
        assert image.content.startswith(b"\xff\xd8\xff") and image.content.endswith(b"\xff\xd9")
