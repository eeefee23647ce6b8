"""The fair policy's state in Redis (issue 27): what a submit stores, the start deadlines'
index and the ``expire`` move, the window read, the workflows' run means recorded as a run
succeeds, the decayed usage charged at grants, and Redis memory per waiting task."""

from __future__ import annotations

import math
import time

import orjson
import pytest
import redis.asyncio as aioredis

from aigcq.domain import AS_SUBMITTED, Ordering, TaskState
from aigcq.queue.store import TaskStore
from aigcq.scheduler.policy import next_mean

#: a payload of the size seed clients send (a RunningHub workflow and a few nodes)
PAYLOAD = {
    "workflowId": "1904136902449209346",
    "nodeInfoList": [
        {"nodeId": str(n), "fieldName": "text", "fieldValue": "a cat on a mat, " * 4}
        for n in range(4)
    ],
}


def make_store(redis: aioredis.Redis) -> TaskStore:
    return TaskStore(redis, "t", retention_s=60, outbox_retention_s=3600)


async def submit(store: TaskStore, task_id: str, ordering: Ordering = AS_SUBMITTED) -> None:
    await store.submit(
        task_id,
        aigc="p",
        platform="comfyui",
        backend_id="b1",
        payload=PAYLOAD,
        ordering=ordering,
    )


async def test_a_task_without_the_fields_is_stored_as_before(redis: aioredis.Redis) -> None:
    store = make_store(redis)
    await submit(store, "plain")
    fields = await redis.hkeys("t:task:plain")
    assert not {"userId", "credit", "startBy", "keepWaiting"} & set(fields)
    assert await redis.zcard("t:startby") == 0


async def test_the_ordering_is_stored_and_read_back_in_the_window(redis: aioredis.Redis) -> None:
    store = make_store(redis)
    before = time.time()
    await submit(store, "a", Ordering(user="u1", credit_s=30, max_wait_s=5))
    await submit(store, "b", Ordering(max_wait_s=5, keep_waiting=True))
    await submit(store, "c")
    window = await store.reads.window([("p", "comfyui")], 10, "bridge")
    a, b, c = window.tasks
    assert (a.task_id, a.user, a.credit_s, a.keep_waiting) == ("a", "u1", 30.0, False)
    assert a.start_by is not None and before + 5 <= a.start_by <= time.time() + 5
    assert (b.keep_waiting, b.start_by is not None) == (True, True)
    assert (c.user, c.credit_s, c.start_by, c.keep_waiting) == ("", 0.0, None, False)
    # only a expires (b waits on past its deadline)
    assert await redis.zrange("t:startby", 0, -1) == ["a"]
    assert window.busy == [] and window.runs == {} and window.usage == {}


async def _submit_many(
    store: TaskStore, prefix: str, n: int, *, workflow: str, user: str = ""
) -> None:
    payload = {**PAYLOAD, "workflowId": workflow}
    for i in range(n):
        await store.submit(
            f"{prefix}{i}", aigc="p", platform="comfyui", backend_id="b1", payload=payload,
            ordering=Ordering(user=user),
        )  # fmt: skip


@pytest.mark.parametrize("depth", [1500, 20000])
async def test_a_paused_workflow_hides_no_ready_task_at_any_depth(
    redis: aioredis.Redis, depth: int
) -> None:
    """Issue 37 items 2 and 8: a ready task behind ``depth`` tasks of a paused workflow is
    read by the round and claimed from the head, with a read that does not grow with the
    paused key's depth; a resume brings the paused ones back in their order."""
    store = make_store(redis)
    pipe_depth = depth
    await _submit_many(store, "held", pipe_depth, workflow="held")
    await _submit_many(store, "ready", 1, workflow="free")
    assert await store.pause_workflow("held", orjson.dumps({"since": 1.0}))
    assert await redis.hexists("t:pauses", "workflow:held")
    assert not await store.pause_workflow("held", orjson.dumps({"since": 2.0}))  # no change
    window = await store.reads.window([("p", "comfyui")], 4, "bridge")
    assert [t.task_id for t in window.tasks] == ["ready0"]
    [claimed] = await store.claim("p", "comfyui", "runninghub", cap=-1, n=5, deadline_s=60)
    assert claimed.task_id == "ready0"
    assert await redis.zcard("t:p:comfyui:wait") == pipe_depth  # the paused ones wait on
    assert await store.pause_workflow("held", None)
    window = await store.reads.window([("p", "comfyui")], 2, "bridge")
    assert [t.task_id for t in window.tasks] == ["held0", "held1"]


async def test_a_user_at_its_limit_hides_no_other_users_task(redis: aioredis.Redis) -> None:
    """Issue 37 items 1 and 8: one user's deep batch at its limit is passed over with one
    count; another user's task behind it is read, and claims check the limit."""
    store = make_store(redis)
    await _submit_many(store, "batch", 1500, workflow="w", user="heavy")
    await _submit_many(store, "single", 1, workflow="w", user="light")
    [first] = await store.claim(
        "p", "comfyui", "bridge", cap=-1, n=1, deadline_s=60, ids=["batch0"], user_limit=1
    )
    assert first.task_id == "batch0"
    window = await store.reads.window([("p", "comfyui")], 4, "bridge", user_limit=1)
    assert [t.task_id for t in window.tasks] == ["single0"]
    assert window.users == {("p", "heavy"): 1, ("p", "light"): 0}
    refused = await store.claim(
        "p", "comfyui", "bridge", cap=-1, n=1, deadline_s=60, ids=["batch1"], user_limit=1
    )
    assert refused == []


async def test_a_deep_start_deadline_is_read(redis: aioredis.Redis) -> None:
    """Issue 37 item 5: a task with a start deadline behind a thousand of its own key's is
    read by the round (to be rescued), beside the key's head."""
    store = make_store(redis)
    await _submit_many(store, "bulk", 1000, workflow="w")
    await store.submit(
        "urgent", aigc="p", platform="comfyui", backend_id="b1",
        payload={**PAYLOAD, "workflowId": "w"}, ordering=Ordering(max_wait_s=30),
    )  # fmt: skip
    window = await store.reads.window([("p", "comfyui")], 2, "bridge", dated=8)
    assert [t.task_id for t in window.tasks] == ["bulk0", "bulk1", "urgent"]


async def test_expire_ends_a_waiting_task_that_never_ran(redis: aioredis.Redis) -> None:
    store = make_store(redis)
    await submit(store, "late", Ordering(max_wait_s=0))
    assert await store.reads.past_start_by() == ["late"]
    done = await store.expire("late", error={"code": "TaskExpired"}, message={}, note="x")
    assert done.applied and done.state == TaskState.FAILED
    assert await redis.zcard("t:p:comfyui:wait") == 0
    assert await redis.zcard("t:startby") == 0
    [entry] = await redis.xrange("t:outbox:b1")
    assert entry[1]["status"] == "failed"


async def test_expire_leaves_a_task_that_ran_once(redis: aioredis.Redis) -> None:
    """A task claimed and put back after a charged attempt started once: no expiry."""
    store = make_store(redis)
    await submit(store, "ran", Ordering(max_wait_s=0))
    [c] = await store.claim("p", "comfyui", "runninghub", cap=-1, n=1, deadline_s=60)
    assert not (await store.expire("ran", error={}, message={}, note="x")).applied
    assert await redis.zcard("t:startby") == 0  # it left the index
    await store.requeue_for_retry("ran", c.attempt, "lost")
    assert not (await store.expire("ran", error={}, message={}, note="x")).applied
    assert (await store.reads.get("ran")).state == TaskState.PENDING  # type: ignore[union-attr]
    [seen] = (await store.reads.window([("p", "comfyui")], 10, "bridge")).tasks
    assert seen.start_by is None  # the planner does not expire it either


async def test_a_success_on_our_gpus_records_its_workflows_mean(redis: aioredis.Redis) -> None:
    store = make_store(redis)
    store.paid_targets = "runninghub"
    for i, target in enumerate(["bridge", "bridge", "runninghub"]):
        await submit(store, f"t{i}")
        [c] = await store.claim("p", "comfyui", target, cap=-1, n=1, deadline_s=60)
        await store.mark_running(f"t{i}", c.attempt, f"r{i}", deadline_s=60, kind="callback")
        await redis.hset(f"t:task:t{i}", "started", repr(time.time() - 10 * (i + 1)))
        await store.finish(f"t{i}", TaskState.SUCCESS, result={}, from_attempt=c.attempt)
    window = await store.reads.window([("p", "comfyui")], 10, "bridge")
    mean, count = next_mean(*next_mean(0.0, 0, 10.0), 20.0)  # the paid run is not counted
    assert window.runs["1904136902449209346"] == pytest.approx(mean, abs=0.05)
    raw = await redis.hget("t:runs", "1904136902449209346")
    assert raw is not None and raw.endswith(f" {count}")


async def test_the_window_sees_the_tasks_in_flight_on_the_internal_target(
    redis: aioredis.Redis,
) -> None:
    store = make_store(redis)
    for i in range(3):
        await submit(store, f"t{i}")
    [c] = await store.claim("p", "comfyui", "bridge", cap=-1, n=1, deadline_s=60)
    await store.claim("p", "comfyui", "bridge", cap=-1, n=1, deadline_s=60)
    await store.mark_running("t0", c.attempt, "r0", deadline_s=60, kind="callback")
    window = await store.reads.window([("p", "comfyui")], 10, "bridge")
    assert [t.task_id for t in window.tasks] == ["t2"]
    started = sorted(window.busy, key=lambda b: b[1] is None)
    assert started[0][1] is not None and started[1][1] is None


async def _usage(redis: aioredis.Redis, key: str) -> float:
    raw = await redis.get(key)
    return float(raw.split()[0]) if raw else 0.0


async def test_usage_is_charged_on_what_runs_and_corrected_to_its_run_time(
    redis: aioredis.Redis,
) -> None:
    """Issue 37 item 3: a start on our GPUs charges the workflow's mean (here the default,
    10 s), its end corrects it to the time it really ran; a task claimed and handed back
    before it ran, or run on a paid target, charges nothing."""
    store = make_store(redis)
    store.usage_terms = "300.0 10.0"
    for task_id in ("ran", "back", "paid"):
        await submit(store, task_id, Ordering(user="u"))
    [ran] = await store.claim("p", "comfyui", "bridge", cap=-1, n=1, deadline_s=60, ids=["ran"])
    await store.mark_running("ran", ran.attempt, "", deadline_s=60, kind="callback")
    assert 9.99 < await _usage(redis, "t:usage:p") <= 10.0
    assert await _usage(redis, "t:usage:p:user:u") == await _usage(redis, "t:usage:p")
    [back] = await store.claim("p", "comfyui", "bridge", cap=-1, n=1, deadline_s=60, ids=["back"])
    await store.requeue_unrun("back", back.attempt, "no instance could run it")
    [paid] = await store.claim("p", "comfyui", "runninghub", cap=-1, n=1, deadline_s=60)
    await store.mark_running(
        "paid", paid.attempt, "r1", deadline_s=60, kind="callback",
        where=("p", "comfyui", "runninghub"),
    )  # fmt: skip
    assert 9.99 < await _usage(redis, "t:usage:p") <= 10.0
    await store.finish("ran", TaskState.SUCCESS, result={"ok": 1}, from_attempt=ran.attempt)
    ran_s = float(await redis.hget("t:task:ran", "updated")) - float(
        await redis.hget("t:task:ran", "started")
    )
    assert math.isclose(await _usage(redis, "t:usage:p"), ran_s, abs_tol=1e-3)
    assert await redis.hget("t:task:ran", "gpu") is None


async def test_redis_memory_per_waiting_task_stays_under_2_kib(redis: aioredis.Redis) -> None:
    """A waiting task with every issue-27 field set and the seed's example payload: its
    hash, its timeline, its place in the wait list and the start-deadline index, measured
    over many tasks; and what the issue-27 fields add to a task with a larger payload."""
    store = make_store(redis)
    ordering = Ordering(user="user-0123456789", credit_s=120, max_wait_s=600)
    small = {"workflowId": "1904136902449209346", "nodeInfoList": []}
    # what the first tasks create once (the queue, the deadlines' index, Redis's own
    # tables growing): alone in a fresh Redis, 200 tasks measured ~1.5 KiB more each
    await _per_task(store, "w", small, ordering)
    figures = {
        "per_waiting_task_bytes": await _per_task(store, "s", small, ordering),
        "per_waiting_task_bytes_without_fields": await _per_task(store, "n", small, Ordering()),
        "issue27_fields_bytes": await _per_task(store, "f", PAYLOAD, ordering)
        - await _per_task(store, "g", PAYLOAD, Ordering()),
    }
    print(orjson.dumps(figures).decode())
    assert figures["per_waiting_task_bytes"] < 2048, figures
    # issue 37: a task kept by key (its queue's and its key's sorted sets) under 1 KiB
    assert figures["per_waiting_task_bytes_without_fields"] < 1024, figures
    assert figures["issue27_fields_bytes"] < 512, figures


async def _per_task(
    store: TaskStore, name: str, payload: dict[str, object], ordering: Ordering, n: int = 200
) -> int:
    redis = store.redis
    before = int((await redis.info("memory"))["used_memory"])
    for i in range(n):
        await store.submit(
            f"{name}-{i:06d}",
            aigc="p",
            platform="comfyui",
            backend_id="b1",
            payload=payload,
            ordering=ordering,
        )
    return round((int((await redis.info("memory"))["used_memory"]) - before) / n)


async def test_a_queue_written_before_issue_37_is_kept_by_key_and_loses_nothing(
    redis: aioredis.Redis,
) -> None:
    """An upgrade over waiting tasks: the queue is a LIST an older aigcq wrote. The
    dispatch loop's start moves it (``keep_by_key``) and a submit that comes first moves
    it too; nothing is lost, the order is kept, and the tasks are claimable."""
    store = make_store(redis)
    for name in ("old", "older"):
        for i in range(3):
            await submit(store, f"{name}{i}")
        ids = await redis.zrange("t:p:comfyui:wait", 0, -1)
        for key in await redis.keys("t:*wq*") + await redis.keys("t:*:ready:*"):
            await redis.delete(key)
        await redis.delete("t:p:comfyui:wait", "t:wkeys:p:comfyui")
        await redis.rpush("t:p:comfyui:wait", *ids)  # as 48226d9 kept it
        if name == "old":
            assert await store.keep_by_key([("p", "comfyui")]) == 1
            assert await store.keep_by_key() == 0  # once
        else:
            await submit(store, "new")  # the first script to meet it moves it
        assert await redis.type("t:p:comfyui:wait") == "zset"
        claimed = await store.claim("p", "comfyui", "bridge", cap=-1, n=9, deadline_s=60)
        expected = [f"{name}{i}" for i in range(3)] + (["new"] if name == "older" else [])
        assert [c.task_id for c in claimed] == expected


async def test_a_round_reads_the_users_fair_shares_put_first_however_many_wait(
    redis: aioredis.Redis,
) -> None:
    """A queue where 1,500 end users who ran wait with a task each: a round that fills two
    places reads two users, those fair shares put first (one who never ran, then the one
    who ran least), not the 1,500 older heads; first come, first served reads the two
    oldest keys. A start charges its user and moves it in the order at once."""
    store = make_store(redis)
    store.usage_terms = "300.0 10.0"
    now = time.time()
    heavy = 1500
    for i in range(heavy):
        await redis.set(f"t:usage:p:user:heavy{i}", f"{100 + i} {now} 300")
    await redis.set("t:usage:p:user:mid", f"50 {now} 300")
    for i in range(heavy):
        await submit(store, f"h{i}", Ordering(user=f"heavy{i}"))
    for task_id, user in (("m0", "mid"), ("l0", "light"), ("l1", "light")):
        await submit(store, task_id, Ordering(user=user))
    window = await store.reads.window([("p", "comfyui")], 3, "bridge", users_max=2)
    assert [t.task_id for t in window.tasks] == ["l0", "l1", "m0"]
    window = await store.reads.window([("p", "comfyui")], 3, "bridge", users_max=2, by_rank=True)
    assert [t.task_id for t in window.tasks] == ["h0", "h1"]
    [ran] = await store.claim("p", "comfyui", "bridge", cap=-1, n=1, deadline_s=60, ids=["l0"])
    await store.mark_running("l0", ran.attempt, "", deadline_s=60, kind="callback")
    window = await store.reads.window([("p", "comfyui")], 3, "bridge", users_max=2)
    assert [t.task_id for t in window.tasks] == ["l1", "m0"]  # light ran 10 s, mid 50


async def test_the_users_index_is_rebuilt_from_the_ready_keys(redis: aioredis.Redis) -> None:
    """A queue an aigcq kept by key before the users index (or one that lost it): the
    dispatch loop's start (``keep_by_key``) indexes its ready keys again, the same."""
    store = make_store(redis)
    for i, user in enumerate(["a", "b", "a", ""]):
        await submit(store, f"t{i}", Ordering(user=user))
    index = sorted(await redis.keys("t:ru*"))
    before = {k: await redis.zrange(k, 0, -1, withscores=True) for k in index}
    assert len(before) == 4  # the users, and each one's ready keys
    await redis.delete(*index)
    assert await store.keep_by_key() == 0  # no queue to move, the index completed
    assert {k: await redis.zrange(k, 0, -1, withscores=True) for k in index} == before
