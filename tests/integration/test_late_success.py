"""Issue 25 item 2: a paid result that arrives after its task failed ``UncertainSubmit``
still wins, by a later poll too: the create's reply (here replayed from a dead process's
journal) names the remote task after the failure; it is watched, not cancelled, and its
success reaches the client after the failure (the fences, other attempts and other
failures, are in test_store.py)."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from aigcq.domain import TaskState
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from aigcq.scheduler.journal import Entry
from tests.fakes.client import generate
from tests.fakes.paid import Paid, models, paid_stack
from tests.fakes.waiting import until

#: webhooks go nowhere: only a poll can bring the result
NO_WEBHOOKS = "http://127.0.0.1:9"


async def replay_accepted(env: Paid, task_id: str) -> str:
    """What a journal replay after a restart does: record the create RunningHub accepted
    for attempt 1 (its reply was lost here); its remote id."""
    (create,) = await env.creates(task_id)
    task = await env.task(task_id)
    entry = Entry(
        task_id, 1, task.backend_id, create["remote"], "proj", "comfyui", "runninghub", "polling"
    )
    queue = (entry.aigc, entry.platform)
    await env.service.lifecycle.accepted(
        entry, entry.remote_id, queue=queue, target=entry.target, kind=entry.kind, paid=True
    )
    return str(create["remote"])


async def test_a_late_create_reply_is_watched_and_its_success_wins(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    rh = RunningHubEmulatorConfig(duration_s=4.0)
    model = models(deadline_s=1.0)
    async with paid_stack(
        tmp_path, redis, redis_url, rh=rh, model=model, callback_url=NO_WEBHOOKS
    ) as env:
        await env.faults(drop_create_replies=1)
        await env.client.request(generate("p1"))
        await env.client.collect(1, timeout=20)
        assert env.client.results["p1"][0]["code"] == "UncertainSubmit"
        remote = await replay_accepted(env, "p1")
        await until(lambda: env.client.next(timeout=30), lambda m: m["type"] == "result", within=40)
        failed, late = env.client.results["p1"]
        assert late["status"] == "success" and late["late"] is True, late
        assert late["id"] != failed["id"] and late["result"]
        task = await env.task("p1")
        assert task.state is TaskState.SUCCESS
        records = await env.records()
        assert not [c for r in records.values() for c in r["cancels"] if c["remote"] == remote]
        assert len(await env.creates("p1")) == 1
        assert sum(r["current"] for r in records.values()) == 0
        assert not await env.service.rt.store.reads.orphans_of(remote)
