"""TaskStore against a real Redis: every transition is atomic and guarded."""

from __future__ import annotations

import asyncio

import orjson
import pytest
import redis.asyncio as aioredis

from aigcq.domain import TaskState
from aigcq.queue.store import TaskStore


def make_store(redis: aioredis.Redis) -> TaskStore:
    return TaskStore(redis, "t", retention_s=60, outbox_retention_s=3600)


async def submit(store: TaskStore, task_id: str, aigc: str = "p") -> None:
    await store.submit(
        task_id, aigc=aigc, platform="comfyui", backend_id="b1", payload={"workflowId": "w"}
    )


async def test_submit_is_idempotent(redis: aioredis.Redis) -> None:
    store = make_store(redis)
    first = await store.submit("a", aigc="p", platform="comfyui", backend_id="b1", payload={})
    again = await store.submit("a", aigc="p", platform="comfyui", backend_id="b2", payload={})
    assert first.created and not again.created
    assert again.backend_id == "b1"
    assert await redis.zcard("t:p:comfyui:wait") == 1


async def test_claim_respects_cap_and_counts_are_derived(redis: aioredis.Redis) -> None:
    store = make_store(redis)
    for i in range(5):
        await submit(store, f"t{i}")
    claimed = await store.claim("p", "comfyui", "runninghub", cap=3, n=10, deadline_s=60)
    assert [c.task_id for c in claimed] == ["t0", "t1", "t2"]
    assert all(c.attempt == 1 for c in claimed)
    assert await store.claim("p", "comfyui", "runninghub", cap=3, n=10, deadline_s=60) == []
    assert await redis.zcard("t:running:p:runninghub") == 3
    assert await redis.zcard("t:p:comfyui:wait") == 2


async def test_claim_of_given_ids_takes_each_still_waiting_and_keeps_the_others_in_order(
    redis: aioredis.Redis,
) -> None:
    """The bridges' lookahead (issue 24, item 3): the ids chosen from the head are claimed
    in one step; one no longer waiting (claimed elsewhere, cancelled) is skipped; the
    tasks left keep their order."""
    store = make_store(redis)
    for i in range(5):
        await submit(store, f"t{i}")
    [taken] = await store.claim("p", "comfyui", "other", cap=-1, n=1, deadline_s=60)
    assert taken.task_id == "t0"
    ids = ["t0", "t3", "t1", "nope"]
    claimed = await store.claim("p", "comfyui", "bridge", cap=-1, n=4, deadline_s=60, ids=ids)
    assert [(c.task_id, c.attempt) for c in claimed] == [("t3", 1), ("t1", 1)]
    assert await redis.zrange("t:p:comfyui:wait", 0, -1) == ["t2", "t4"]
    capped = await store.claim(
        "p", "comfyui", "bridge", cap=-1, n=1, deadline_s=60, ids=["t4", "t2"]
    )
    assert [c.task_id for c in capped] == ["t4"]
    assert await redis.zrange("t:p:comfyui:wait", 0, -1) == ["t2"]


async def test_concurrent_claims_never_exceed_cap(redis: aioredis.Redis) -> None:
    store = make_store(redis)
    for i in range(50):
        await submit(store, f"t{i}")
    results = await asyncio.gather(
        *(store.claim("p", "comfyui", "rh", cap=7, n=5, deadline_s=60) for _ in range(20))
    )
    ids = [c.task_id for batch in results for c in batch]
    assert len(ids) == 7 == len(set(ids))


async def test_retarget_moves_a_claimed_task_in_its_attempt_within_the_new_cap(
    redis: aioredis.Redis,
) -> None:
    """A task the bridges cannot run goes to the paid platform without a new attempt, never
    above that platform's cap, and not once it moved on."""
    store = make_store(redis)
    for i in range(2):
        await submit(store, f"t{i}")
    first, second = await store.claim("p", "comfyui", "bridge", cap=-1, n=2, deadline_s=60)
    assert await store.retarget("t0", first.attempt + 1, "bridge", "rh", cap=1, deadline_s=60) == -1
    assert await store.retarget("t0", first.attempt, "bridge", "rh", cap=1, deadline_s=60) == 1
    assert await store.retarget("t1", second.attempt, "bridge", "rh", cap=1, deadline_s=60) == 0
    assert await redis.zrange("t:running:p:rh", 0, -1) == ["t0"]
    assert await redis.zrange("t:running:p:bridge", 0, -1) == ["t1"]
    task = await store.reads.get("t0")
    assert task is not None and (task.state, task.target, task.attempt) == (
        TaskState.DISPATCHING,
        "rh",
        1,
    )
    assert await store.retarget("t0", 1, "bridge", "rh", cap=5, deadline_s=60) == -1  # moved


async def test_lifecycle_to_success_queues_one_outbox_message(redis: aioredis.Redis) -> None:
    store = make_store(redis)
    await submit(store, "a")
    [c] = await store.claim("p", "comfyui", "rh", cap=-1, n=1, deadline_s=60)
    assert await store.mark_running("a", c.attempt, "R1", deadline_s=60, kind="callback")
    assert await store.reads.task_for_remote("R1") == "a"
    done = await store.finish("a", TaskState.SUCCESS, result={"x": 1}, message={"data": 1})
    assert done.applied and done.state is TaskState.SUCCESS
    again = await store.finish("a", TaskState.SUCCESS, result={"x": 2})
    assert not again.applied and again.state is TaskState.SUCCESS
    task = await store.reads.get("a")
    assert task is not None and task.result == {"x": 1}
    assert await redis.xlen("t:outbox:b1") == 1
    assert await redis.zcard("t:inflight") == 0
    assert 0 < await redis.ttl("t:task:a") <= 60
    states = [e["state"] for e in await store.reads.timeline("a")]
    assert states == ["pending", "dispatching", "running", "success"]
    assert [t.task_id for t in await store.reads.recent(10)] == ["a"]


async def test_live_task_has_no_ttl(redis: aioredis.Redis) -> None:
    store = make_store(redis)
    await submit(store, "a")
    assert await redis.ttl("t:task:a") == -1


async def test_requeue_with_stale_attempt_is_refused(redis: aioredis.Redis) -> None:
    store = make_store(redis)
    await submit(store, "a")
    [c] = await store.claim("p", "comfyui", "rh", cap=-1, n=1, deadline_s=60)
    assert not await store.requeue_for_retry("a", c.attempt + 1, "stale")
    assert await store.requeue_unrun("a", c.attempt, "ran nothing")
    task = await store.reads.get("a")
    # the attempt number stays (the next dispatch is attempt 2), the charge is given back
    assert task is not None and task.state is TaskState.PENDING
    assert (task.attempt, task.charged) == (1, 0)
    assert await redis.zrange("t:p:comfyui:wait", 0, -1) == ["a"]


async def test_every_requeue_starts_a_new_attempt_without_charging_it(
    redis: aioredis.Redis,
) -> None:
    """Issue 15 item 5: a requeue that gives its attempt back (bridge lost, ACK timeout,
    full, shutdown) still makes the next dispatch a new attempt number, with its own
    webhook URL; the attempt budget is not charged."""
    store = make_store(redis)
    await submit(store, "a")
    [first] = await store.claim("p", "comfyui", "rh", cap=-1, n=1, deadline_s=60)
    assert await store.requeue_unrun("a", first.attempt, "ran nothing")
    [second] = await store.claim("p", "comfyui", "rh", cap=-1, n=1, deadline_s=60)
    assert (first.attempt, second.attempt) == (1, 2)
    assert (first.charged, second.charged) == (1, 1)


async def test_free_requeues_are_bounded(redis: aioredis.Redis) -> None:
    """Issue 15 item 11: only ``free_requeues`` requeues give their attempt back."""
    store = make_store(redis)
    store.free_requeues = 2
    await submit(store, "a")
    charged = []
    for _ in range(4):
        [c] = await store.claim("p", "comfyui", "rh", cap=-1, n=1, deadline_s=60)
        charged.append(c.charged)
        assert await store.requeue_unrun("a", c.attempt, "ran nothing")
    assert charged == [1, 1, 1, 2]


async def test_a_timeline_is_bounded_and_keeps_its_first_entry(redis: aioredis.Redis) -> None:
    """Issue 15 item 11: a task requeued over and over keeps a bounded timeline."""
    store = make_store(redis)
    await submit(store, "a")
    for _ in range(80):
        [c] = await store.claim("p", "comfyui", "rh", cap=-1, n=1, deadline_s=60)
        await store.requeue_unrun("a", c.attempt, "ran nothing")
    timeline = await store.reads.timeline("a")
    assert len(timeline) == 100
    assert timeline[0]["note"] == "submitted" and timeline[-1]["attempt"] == 80


async def test_delayed_requeue_is_promoted_to_the_head(redis: aioredis.Redis) -> None:
    store = make_store(redis)
    await submit(store, "a")
    await submit(store, "b")
    [c] = await store.claim("p", "comfyui", "rh", cap=-1, n=1, deadline_s=60)
    await store.requeue_unrun("a", c.attempt, "busy", delay_s=0.05)
    assert await redis.zrange("t:p:comfyui:wait", 0, -1) == ["b"]
    await asyncio.sleep(0.1)  # time: past the 0.05 s delay
    assert await store.promote_delayed() == 1
    assert await redis.zrange("t:p:comfyui:wait", 0, -1) == ["a", "b"]


async def test_one_delayed_task_is_promoted_before_its_time(redis: aioredis.Redis) -> None:
    """``promote(taskId)``: a retry that waited for its slot elsewhere goes to the head now,
    the others keep their back-off; a task not in the delayed set is left alone."""
    store = make_store(redis)
    for task_id in ("a", "b", "c"):
        await submit(store, task_id)
    claimed = await store.claim("p", "comfyui", "rh", cap=-1, n=2, deadline_s=60)
    for c in claimed:
        await store.requeue_for_retry(c.task_id, c.attempt, "test", delay_s=60)
    assert await store.promote("b")
    assert await redis.zrange("t:p:comfyui:wait", 0, -1) == ["b", "c"]
    assert await redis.zrange("t:delayed", 0, -1) == ["a"]
    assert not await store.promote("b") and not await store.promote("c")
    assert await store.promote_delayed() == 0  # a's back-off is not over


async def test_cancel_pending_removes_it_from_the_queue(redis: aioredis.Redis) -> None:
    store = make_store(redis)
    await submit(store, "a")
    done = await store.finish("a", TaskState.CANCELLED)
    assert done.applied
    assert await redis.zcard("t:p:comfyui:wait") == 0


async def test_finish_unknown_task(redis: aioredis.Redis) -> None:
    store = make_store(redis)
    done = await store.finish("nope", TaskState.SUCCESS)
    assert not done.applied and done.state is None


async def test_a_retry_while_a_create_may_be_out_keeps_it_in_the_cap(
    redis: aioredis.Redis,
) -> None:
    """``retry_uncertain`` at the deadline: the task goes back to waiting while its first
    create may run (no remote id yet). That create stays counted in its account's cap, as
    ``create:<createId>``, exactly as when the task is finished instead."""
    store = make_store(redis)
    store.paid_targets = "runninghub"
    await submit(store, "u1")
    (c,) = await store.claim("p", "comfyui", "runninghub", cap=1, n=1, deadline_s=60)
    assert await store.begin_create("u1", c.attempt, "c1", deadline_s=60)
    await store.mark_running("u1", c.attempt, "", deadline_s=60, kind="callback")
    assert await store.requeue_for_retry("u1", c.attempt, "deadline passed")
    assert await redis.zrange("t:orphans:p:runninghub", 0, -1) == ["create:c1"]
    orphan = await store.reads.orphans_of("create:c1")
    assert orphan is not None and orphan.awaiting_create and orphan.attempt == c.attempt
    assert await store.claim("p", "comfyui", "runninghub", cap=1, n=1, deadline_s=60) == []


async def test_a_script_argument_missing_or_unknown_is_refused_before_redis(
    redis: aioredis.Redis,
) -> None:
    store = make_store(redis)
    with pytest.raises(TypeError, match=r"script promote: missing \['limit'\]"):
        await store._run("promote", now=1.0, only="")
    with pytest.raises(TypeError, match=r"unknown \['front'\]"):
        await store._run("promote", now=1.0, limit=1, only="", front=True)


async def test_an_acknowledgement_records_its_bridge_in_the_same_step(
    redis: aioredis.Redis,
) -> None:
    """``mark_running(holder=...)``: the bridge's tasks hash and the task's bridges hash
    are written by the script that marks the task running (one round trip)."""
    store = make_store(redis)
    await submit(store, "a")
    await submit(store, "b")
    a, b = await store.claim("p", "comfyui", "bridge", cap=-1, n=2, deadline_s=60)
    assert await store.mark_running(
        "a", a.attempt, "a", deadline_s=60, kind="callback", holder="br1", holder_ttl_s=120
    )
    assert await redis.hgetall("t:bridge:br1:tasks") == {"a": str(a.attempt)}
    assert await redis.hgetall("t:bridgesof:a") == {"br1": str(a.attempt)}
    assert 0 < await redis.ttl("t:bridge:br1:tasks") <= 120
    assert 0 < await redis.ttl("t:bridgesof:a") <= 120
    # a task that moved on is not recorded as held
    assert await store.requeue_unrun("b", b.attempt, "test")
    assert not await store.mark_running(
        "b", b.attempt, "b", deadline_s=60, kind="callback", holder="br1", holder_ttl_s=120
    )
    assert await redis.hgetall("t:bridge:br1:tasks") == {"a": str(a.attempt)}
    assert not await redis.exists("t:bridgesof:b")
    # without a holder nothing is recorded
    await submit(store, "c")
    claimed = await store.claim("p", "comfyui", "bridge", cap=-1, n=2, deadline_s=60)
    assert [x.task_id for x in claimed] == ["b", "c"]  # b went back to the head
    assert await store.mark_running("c", claimed[1].attempt, "c", deadline_s=60, kind="callback")
    assert not await redis.exists("t:bridgesof:c")


async def test_an_unsent_task_goes_back_only_while_nothing_may_be_out(
    redis: aioredis.Redis,
) -> None:
    store = make_store(redis)
    await submit(store, "a")
    [c] = await store.claim("p", "comfyui", "rh", cap=-1, n=1, deadline_s=60)
    assert await store.begin_create("a", c.attempt, "c1", deadline_s=60)
    assert not await store.requeue_unsent("a", c.attempt, "stopped")  # a create may be out
    await submit(store, "b")
    [c] = await store.claim("p", "comfyui", "bridge", cap=-1, n=1, deadline_s=60)
    assert await store.mark_running("b", c.attempt, "b", deadline_s=60, kind="callback")
    assert not await store.requeue_unsent("b", c.attempt, "stopped")  # running: it was sent
    await submit(store, "d")
    [c] = await store.claim("p", "comfyui", "rh", cap=-1, n=1, deadline_s=60)
    assert await store.requeue_unsent("d", c.attempt, "stopped")
    task = await store.reads.get("d")
    assert task is not None and (task.state, task.charged) == (TaskState.PENDING, 0)


async def test_a_hand_back_names_the_remote_task_it_gives_back(redis: aioredis.Redis) -> None:
    store = make_store(redis)
    await submit(store, "a")
    [c] = await store.claim("p", "comfyui", "md", cap=-1, n=1, deadline_s=60)
    assert await store.mark_running("a", c.attempt, "r1", deadline_s=60, kind="callback")
    assert not await store.requeue_handed_back("a", c.attempt, "r2", "handed back")
    assert await store.requeue_handed_back("a", c.attempt, "r1", "handed back")
    task = await store.reads.get("a")
    assert task is not None and (task.state, task.charged, task.remote_id) == (
        TaskState.PENDING,
        1,
        "",
    )
    assert await redis.zrange("t:p:comfyui:wait", 0, -1) == ["a"]


async def test_an_acceptance_for_a_task_long_gone_leaves_no_orphan(redis: aioredis.Redis) -> None:
    """A journal replayed after the task's retention (or into another Redis): nothing of
    ours runs for it any more, so nothing is counted in the cap."""
    store = make_store(redis)
    where = ("p", "comfyui", "runninghub")
    marked = await store.mark_running("gone", 1, "r1", deadline_s=60, kind="callback", where=where)
    assert not marked.running and not marked.orphaned
    assert await redis.zcard("t:orphans:p:runninghub") == 0


async def test_failed_and_cancelled_ends_are_listed_for_replays_while_retained(
    redis: aioredis.Redis,
) -> None:
    store = make_store(redis)  # retention 60 s
    for task_id in ("f", "c", "s"):
        await submit(store, task_id)
    await store.finish("f", TaskState.FAILED, error={"code": "x"})
    await store.finish("c", TaskState.CANCELLED)
    await store.finish("s", TaskState.SUCCESS, result={"ok": 1})
    assert set(await redis.zrange("t:replayable", 0, -1)) == {"f", "c"}
    await redis.zadd("t:replayable", {"old": 1.0})  # ended long before the retention
    assert (await store.retry("f")).applied
    await submit(store, "later")
    await store.finish("later", TaskState.FAILED, error={"code": "x"})
    assert set(await redis.zrange("t:replayable", 0, -1)) == {"c", "later"}


async def test_a_requeue_an_operators_pause_made_gives_its_attempt_back_always(
    redis: aioredis.Redis,
) -> None:
    store = make_store(redis)
    store.free_requeues = 1
    await submit(store, "a")
    for _ in range(3):
        [c] = await store.claim("p", "comfyui", "bridge", cap=-1, n=1, deadline_s=60)
        assert c.charged == 1
        assert await store.requeue_unrun("a", c.attempt, "its account is paused", held=True)


async def uncertain_then_failed(store: TaskStore, task_id: str, code: str) -> int:
    """A paid create whose outcome stayed unknown, then its task failed with ``code`` at
    its deadline; the attempt (its run is kept counted as ``create:c-<task_id>``)."""
    store.paid_targets = "runninghub"
    await submit(store, task_id)
    (c,) = await store.claim("p", "comfyui", "runninghub", cap=-1, n=1, deadline_s=60)
    assert await store.begin_create(task_id, c.attempt, f"c-{task_id}", deadline_s=60)
    await store.mark_running(task_id, c.attempt, "", deadline_s=60, kind="callback")
    error = {"code": code, "message": "deadline", "detail": None}
    done = await store.finish(
        task_id, TaskState.FAILED, error=error, message={"error": error},
        from_attempt=c.attempt, fenced=True,
    )  # fmt: skip
    assert done.applied and done.orphan == f"create:c-{task_id}"
    return c.attempt


async def test_a_late_success_of_the_same_attempt_wins_over_uncertain_submit_only(
    redis: aioredis.Redis,
) -> None:
    """Issue 25 item 2: the success of the run an ``UncertainSubmit`` gave up on moves the
    task to success and queues a second message (``late``) for its client; of any other
    attempt, or after any other failure, it changes nothing but keeping it for a replay."""
    store = make_store(redis)
    attempt = await uncertain_then_failed(store, "l1", "UncertainSubmit")
    stale = await store.finish("l1", TaskState.SUCCESS, result=[1], from_attempt=attempt + 1)
    assert not stale.applied and stale.state is TaskState.FAILED
    done = await store.finish(
        "l1", TaskState.SUCCESS, result=[{"fileUrl": "u"}], message={"result": []},
        from_attempt=attempt, ended=True,
    )  # fmt: skip
    assert done.applied and done.late and done.state is TaskState.SUCCESS
    task = await store.reads.get("l1")
    assert task is not None and task.state is TaskState.SUCCESS and task.error is None
    assert task.result == [{"fileUrl": "u"}]
    entries = await redis.xrange("t:outbox:b1")
    assert [e[1]["status"] for e in entries] == ["failed", "success"]
    assert orjson.loads(entries[1][1]["body"]) == {"result": [{"fileUrl": "u"}], "late": True}
    assert not await redis.zrange("t:orphans:p:runninghub", 0, -1)
    again = await store.finish("l1", TaskState.SUCCESS, result=[2], from_attempt=attempt)
    assert not again.applied and len(await redis.xrange("t:outbox:b1")) == 2

    other = await uncertain_then_failed(store, "l2", "TaskTimeout")
    kept = await store.finish("l2", TaskState.SUCCESS, result=[3], from_attempt=other, ended=True)
    assert not kept.applied and kept.state is TaskState.FAILED
    assert await redis.hget("t:task:l2", "paidResult") == "[3]"
    assert [e[1]["taskId"] for e in await redis.xrange("t:outbox:b1")].count("l2") == 1


async def test_a_late_create_reply_after_uncertain_submit_is_awaited_and_its_poll_wins(
    redis: aioredis.Redis,
) -> None:
    """The reply (or a journal's record) of the create an ``UncertainSubmit`` gave up on:
    its remote task is watched (``awaited``, never cancelled) and a poll's success wins."""
    store = make_store(redis)
    attempt = await uncertain_then_failed(store, "l3", "UncertainSubmit")
    where = ("p", "comfyui", "runninghub")
    marked = await store.mark_running(
        "l3", attempt, "r3", deadline_s=60, kind="polling", where=where
    )
    assert not marked and marked.awaited and not marked.orphaned
    orphan = await store.reads.orphans_of("r3")
    assert orphan is not None and orphan.awaited
    assert await redis.zrange("t:orphans:p:runninghub", 0, -1) == ["r3"]
    released = await store.release_orphan("r3", {"outputs": 1})
    assert released and released.moved is not None and released.moved.late
    assert (await store.reads.get("l3")).state is TaskState.SUCCESS  # type: ignore[union-attr]
