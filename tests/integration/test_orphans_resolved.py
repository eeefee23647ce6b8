"""Issue 15: an unwanted remote task leaves its account's cap as soon as it is known to
have ended — by its own webhook, not only by the periodic re-check — and a cancel while a
create's outcome is unknown keeps the cap slot until that create is resolved.

The sweeper (and so the orphans' re-check) is switched off where a test shows what the
webhook alone does (``sweep_interval_s=3600``)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import redis.asyncio as aioredis

from aigcq.domain import Task, TaskState
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from aigcq.plumbing.text import text
from tests.fakes.client import generate
from tests.fakes.paid import RH_KEY, Paid, created, expire_now, models, paid_stack
from tests.fakes.waiting import until

FAILED = {"code": 805, "msg": "APIKEY_TASK_STATUS_ERROR", "data": None}
NO_RECHECK = {"sweep_interval_s": 3600}


async def counted(env: Paid) -> int:
    """Remote tasks counted in the account's cap as orphans."""
    keys = env.service.rt.store.keys
    return int(await env.service.rt.redis.zcard(keys.orphans("proj", "runninghub")))


async def orphaned_attempts(env: Paid) -> list[int]:
    """The attempts whose runs are counted as orphans."""
    store = env.service.rt.store
    remotes = await env.service.rt.redis.zrange(store.keys.orphans("proj", "runninghub"), 0, -1)
    found = [await store.reads.orphans_of(text(r)) for r in remotes]
    return sorted(o.attempt for o in found if o is not None)


# ---- item 2: an orphan's own webhook releases it -----------------------------------------


async def test_a_cancelled_runs_own_webhook_frees_its_slot_without_a_recheck(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """RunningHub reports the cancelled run's end by webhook: that frees the account's
    one slot at once, and the next task runs (no re-check ever comes here)."""
    rh = RunningHubEmulatorConfig(duration_s=60, max_concurrent=5)
    model = models(concurrency=1)
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, model=model, **NO_RECHECK) as env:
        await env.cancel_running("o1")
        await env.runs_alone("o2")


async def test_only_the_webhook_of_the_orphaned_attempt_releases_it(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Fencing: a signed TASK_END of another attempt of the same task, or of another
    task, leaves the orphan counted; the orphaned attempt's own one releases it."""
    rh = RunningHubEmulatorConfig(duration_s=60, max_concurrent=5)
    dead = {"callback_url": "http://127.0.0.1:9", **NO_RECHECK}  # webhooks by hand only
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, model=models(), **dead) as env:
        await env.cancel_running("f1")
        await env.client.request(generate("f2"))
        await until(partial(env.task, "f2"), lambda t: t.state is TaskState.RUNNING)
        assert await counted(env) == 1
        assert await env.post_task_end("f1", 2, FAILED, here=True) == 410  # never orphaned
        assert await env.post_task_end("f2", 1, FAILED, here=True) == 200  # another task's own end
        assert await counted(env) == 1
        assert await env.post_task_end("f1", 1, FAILED, here=True) == 410  # the task is over...
        assert await counted(env) == 0  # ...and so is its run
        assert await env.post_task_end("f1", 1, FAILED, here=True) == 410  # again: nothing to free
        assert (await env.task("f1")).state is TaskState.CANCELLED


async def test_an_older_attempts_success_releases_that_attempts_orphan(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Attempt 1 was given up at its deadline (kept counted as an orphan) and retried;
    its late success wins, and it is known to have ended: only attempt 2 stays counted."""
    rh = RunningHubEmulatorConfig(duration_s=60, max_concurrent=5)
    dead = {"callback_url": "http://127.0.0.1:9", **NO_RECHECK}
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, **dead) as env:
        store = env.service.rt.store
        await env.client.request(generate("w1"))
        await until(partial(env.task, "w1"), lambda t: t.state is TaskState.RUNNING)
        await expire_now(env, "w1")
        await env.service.sweeper._expire("w1")  # still running: retried, run 1 counted

        async def promoted() -> Task:
            await store.promote_delayed()
            return await env.task("w1")

        await until(promoted, lambda t: t.attempt == 2 and t.state is TaskState.RUNNING)
        assert await counted(env) == 1  # attempt 1's run
        success = {"code": 0, "msg": "success", "data": [{"fileUrl": "http://x/1.png"}]}
        assert await env.post_task_end("w1", 1, success, here=True) == 200
        assert await orphaned_attempts(env) == [2]


# ---- item 3: a cancel while a create's outcome is unknown --------------------------------


async def test_a_cancel_during_the_create_keeps_the_slot_until_its_reply(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """The create is out (RunningHub accepted it; its reply is late) when the client
    cancels: the slot stays taken until the reply names the remote task, which is then
    cancelled; only then does the next task run. Never two at once on a cap of one."""
    rh = RunningHubEmulatorConfig(duration_s=60, max_concurrent=5)
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, model=models(concurrency=1)) as env:
        await env.faults(delay_create_reply_s=1.0)
        await env.client.request(generate("d1"))
        await created(env, "d1")
        assert (await env.task("d1")).state is TaskState.DISPATCHING
        await env.service.gateway.cancel("d1", None)
        await env.client.request(generate("d2"))
        await created(env, "d2")
        records = (await env.records())[RH_KEY]
        assert records["peak"] == 1, records
        [create] = await env.creates("d1")
        assert create["remote"] in [c["remote"] for c in records["cancels"]]


async def test_a_cancel_after_a_lost_create_reply_keeps_the_slot_until_its_webhook(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """The create's reply was lost (no remote id, ever): after a cancel the slot stays
    taken until the run's own webhook says it ended."""
    rh = RunningHubEmulatorConfig(duration_s=1.5, max_concurrent=5)
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, model=models(concurrency=1)) as env:
        await env.faults(drop_create_replies=1)
        await env.client.request(generate("u1"))
        await until(partial(env.task, "u1"), lambda t: t.state is TaskState.RUNNING)
        assert (await env.task("u1")).remote_id == ""
        await env.service.gateway.cancel("u1", None)
        assert await counted(env) == 1
        await env.client.request(generate("u2"))
        await env.client.collect(2, timeout=20)
        assert env.client.results["u2"][0]["status"] == "success"
        records = (await env.records())[RH_KEY]
        assert records["peak"] == 1, records
        assert await counted(env) == 0


async def test_a_create_never_resolved_is_released_after_the_maximum_run_time(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """No reply and no webhook ever: the slot is held until the platform's maximum run
    time since the create has passed (``paid_max_run_s``), then freed."""
    rh = RunningHubEmulatorConfig(duration_s=60, max_concurrent=5)
    model = models(concurrency=1, deadline_s=1.0)
    dead = {"callback_url": "http://127.0.0.1:9", "paid_max_run_s": {"runninghub": 1.5}}
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, model=model, **dead) as env:
        await env.faults(drop_create_replies=1)
        await env.client.request(generate("n1"))
        await until(partial(env.task, "n1"), lambda t: t.state is TaskState.RUNNING)
        await env.service.gateway.cancel("n1", None)
        assert await counted(env) == 1
        await env.client.request(generate("n2"))
        await created(env, "n2")
        assert await counted(env) == 0


# ---- issue 25 item 3: a retry after an uncertain create keeps the cap ---------------------


async def test_retry_uncertain_waits_for_the_first_create_on_a_cap_of_one(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """The create's reply was lost and no webhook comes (the callback URL is dead): at the
    deadline ``retry_uncertain`` sends the task again, but the first create may still run,
    so its slot stays counted until the platform's maximum run time: never two at once."""
    rh = RunningHubEmulatorConfig(duration_s=5.0, max_concurrent=5)
    model = models(concurrency=1, deadline_s=1.0, retry_uncertain=True)
    dead = {"callback_url": "http://127.0.0.1:9", "paid_max_run_s": {"runninghub": 6.0}}
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, model=model, **dead) as env:
        await env.faults(drop_create_replies=1)
        await env.client.request(generate("c1"))
        await created(env, "c1", n=2)
        records = (await env.records())[RH_KEY]
        assert records["peak"] == 1, records


async def test_an_uncertain_create_is_freed_once_runninghub_says_the_key_runs_nothing(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """RunningHub cannot be asked about a create without its id, but it tells how many
    tasks the key runs (``accountStatus``): once that is 0 the lost create is not running,
    and the retry goes out long before the maximum run time. Still never two at once."""
    rh = RunningHubEmulatorConfig(duration_s=2.0, max_concurrent=5)
    model = models(concurrency=1, deadline_s=1.0, retry_uncertain=True)
    dead = {"callback_url": "http://127.0.0.1:9", "paid_max_run_s": {"runninghub": 600.0}}
    quick = {"http_timeout_s": 1.0}  # the create's request is surely over 6 s after it
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, model=model, **dead, **quick) as env:
        await env.faults(drop_create_replies=1)
        await env.client.request(generate("z1"))
        await created(env, "z1", n=2)
        records = (await env.records())[RH_KEY]
        assert records["peak"] == 1, records
