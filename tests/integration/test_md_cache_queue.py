"""The dispatcher's cache queue (seed 000 §9): failure retries, stale expiry with a failure
webhook, and the ``md:cache:*`` mirrors."""

from __future__ import annotations

import asyncio

import orjson

import tests.fakes.message_dispatcher as mds
from tests.fakes.bridge import Bridge
from tests.fakes.servers import Recorder, serve_app
from tests.fakes.waiting import until

md = mds.md  # the dispatcher fixture


async def _submit(md: mds.Md, **extra: object) -> str:
    body = {**mds.BODY, "apiKey": await md.token(), **extra}
    task_id: str = (await md.http.post("/api/task", json=body)).json()["data"]["taskId"]
    return task_id


async def _state(md: mds.Md, task_id: str) -> str:
    task = await md.task(task_id)
    return task.state.value if task else ""


async def test_a_failed_task_is_retried_three_times_then_fails(md: mds.Md) -> None:
    recorder = Recorder()
    md.dispatcher.service.rt.settings.bridge_failure_limit = 10  # keep the bridge in rotation
    bridge = await Bridge.connect(md.port)
    await bridge.register(count=1)
    async with serve_app(recorder.app) as hook_base:
        task_id = await _submit(md, webhookUrl=f"{hook_base}/hook")
        for attempt in (1, 2, 3, 4):
            assign = await bridge.next(timeout=10)
            assert assign["data"]["taskId"] == task_id and assign["data"]["attempt"] == attempt
            await bridge.ack(task_id)
            await mds.md_task_end(md, assign["data"]["webhookUrl"], code=805)
        await until(lambda: _state(md, task_id), lambda s: s == "failed")
        (event,) = await recorder.wait_for(1)
        assert orjson.loads(event.json()["eventData"])["code"] == 805
    await bridge.ws.close()


async def test_stale_pending_task_expires_with_a_failure_webhook(md: mds.Md) -> None:
    recorder = Recorder()
    cache = md.dispatcher.cache
    async with serve_app(recorder.app) as hook_base:
        task_id = await _submit(md, webhookUrl=f"{hook_base}/hook")
        await cache.pass_once()
        assert await _state(md, task_id) == "pending"
        cache.stale_after_s = 0.05
        await asyncio.sleep(0.1)  # time: the task is now older than stale_after_s
        await cache.pass_once()
        task = await md.task(task_id)
        assert task is not None and task.state == "failed"
        assert task.error is not None and task.error["code"] == "TaskExpired"
        event = (await recorder.wait_for(1))[0].json()
        assert event["event"] == "TASK_END" and event["taskId"] == task_id
    assert await md.redis.llen("md:cache:pending") == 0


async def test_cache_keys_mirror_the_queue(md: mds.Md) -> None:
    bridge = await Bridge.connect(md.port)
    await bridge.register(count=1)
    running_id = await _submit(md)
    assign = await bridge.next()
    await bridge.ack(running_id)
    waiting_id = await _submit(md)
    await until(lambda: _state(md, running_id), lambda s: s == "running")
    md.dispatcher.feed.refresh()
    await md.dispatcher.cache.pass_once()

    (pending,) = map(orjson.loads, await md.redis.lrange("md:cache:pending", 0, -1))
    assert pending["taskId"] == waiting_id and pending["payload"] == mds.BODY
    assert pending["retryCount"] == 0 and pending["submittedAt"]
    processing = orjson.loads(await md.redis.hget("md:cache:processing", running_id) or "{}")
    assert processing["bridgeId"] == "br1" and processing["instanceId"] == "br1#0"
    assert processing["startTime"] and processing["payload"] == mds.BODY

    await mds.md_task_end(md, assign["data"]["webhookUrl"])
    await md.dispatcher.cache.pass_once()
    (completed,) = map(orjson.loads, await md.redis.lrange("md:cache:completed", 0, -1))
    assert completed["taskId"] == running_id and completed["status"] == "success"
    await bridge.ws.close()
