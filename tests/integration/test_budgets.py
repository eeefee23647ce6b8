"""Issue 28 item 3, budgets and balance floors, through a real service, Redis and the
RunningHub emulator (each task reports 1.00 spent, ``consumeMoney``): a project's and an
account's daily and monthly limits, with the project's tasks waiting for internal capacity
(the paid target held) or failing ``BudgetExceeded``; a new day lifts the hold (the
service's clock moved, no real day waited); two serve processes stay within the bound."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from aigcq.domain import TaskState
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from tests.fakes.bridge import BRIDGE_TOKEN, Bridge
from tests.fakes.client import generate
from tests.fakes.paid import RH_KEY, Paid, paid_stack, serve_beside
from tests.fakes.waiting import until

HOLD = "hold:budget:proj/runninghub"


def rh(duration_s: float = 0.1, **options: Any) -> RunningHubEmulatorConfig:
    return RunningHubEmulatorConfig(duration_s=duration_s, consume_money=1.0, **options)


def model(concurrency: int = 5, budget: dict[str, Any] | None = None, **account: Any) -> Any:
    entry = {"apikey": RH_KEY, "concurrency": concurrency, **account}
    project: dict[str, Any] = {"comfyui": entry}
    if budget is not None:
        project["budget"] = budget
    return {"proj": project}


async def holds(env: Paid) -> dict[str, Any]:
    keys = env.service.rt.store.keys
    return dict(await env.service.rt.redis.hgetall(keys.pauses))


async def spend_then(env: Paid, n: int) -> None:
    """Run ``n`` tasks to their end (each spends 1.00)."""
    for i in range(n):
        await env.client.request(generate(f"spent-{i}"))
    await env.client.collect(n, timeout=30)
    assert all(r[0]["status"] == "success" for r in env.client.results.values())
    # each charged just after its end is applied: the next create must see all of them
    day = partial(env.service.lifecycle.spend.view, "day")
    await until(day, lambda v: v["total"]["tasks"] >= n, within=15)


async def waits_held(env: Paid, task_id: str) -> None:
    """``task_id`` is not sent: it waits, and the project's paid target is held."""
    await env.client.request(generate(task_id))
    found = await until(partial(holds, env), lambda h: HOLD in h, within=20)
    assert "budget" in found[HOLD] and "reached" in found[HOLD]
    await until(partial(env.task, task_id), lambda t: t.state is TaskState.PENDING, within=20)
    assert await env.creates(task_id) == []


async def test_a_project_s_daily_budget_holds_its_paid_target_and_tasks_wait_for_our_gpus(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    budget = {"day": 2}
    async with paid_stack(
        tmp_path, redis, redis_url, model=model(budget=budget), rh=rh(), bridge_token=BRIDGE_TOKEN
    ) as env:
        await spend_then(env, 2)
        await waits_held(env, "third")
        refused = env.service.paid.budgets
        view = await refused.view()
        [project] = view["projects"]
        assert project["day"]["reached"] and project["day"]["spent"] == 2.0
        [queue] = (await env.service.monitor.snapshot(sample=False))["queues"]
        assert [h.split(" (")[0] for h in queue["heldBy"]] == ["budget hold proj/runninghub"]
        bridge = await Bridge.connect(int(env.base.rsplit(":", 1)[1]))
        await bridge.register(count=1)
        assign = await bridge.next()
        assert (assign["type"], assign["data"]["taskId"]) == ("TASK_ASSIGN", "third")
        await bridge.ws.close()


async def test_a_project_s_monthly_budget_fails_its_tasks_when_it_says_so(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    budget = {"month": 1, "on_limit": "fail"}
    async with paid_stack(tmp_path, redis, redis_url, model=model(budget=budget), rh=rh()) as env:
        await spend_then(env, 1)
        await env.client.request(generate("over"))
        await env.client.collect(2, timeout=20)
        [over] = env.client.results["over"]
        assert (over["status"], over["code"]) == ("failed", "BudgetExceeded")
        assert over["msg"] == "付费平台的预算已用完，任务未提交。"
        assert "month budget 1" in over["error"]["message"]
        assert await env.creates("over") == []
        assert HOLD not in await holds(env)  # a failing project is not held


async def test_an_account_s_daily_budget_holds_every_project_on_its_key(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    projects = model()
    projects["proj"]["comfyui"]["budget"] = {"day": 1}
    projects["other"] = {"comfyui": {"apikey": RH_KEY, "concurrency": 5}}
    async with paid_stack(tmp_path, redis, redis_url, model=projects, rh=rh()) as env:
        await spend_then(env, 1)
        await waits_held(env, "mine")
        await env.client.request(generate("theirs", aigc="other"))
        other = "hold:budget:other/runninghub"
        await until(partial(holds, env), lambda h: other in h, within=20)
        assert await env.creates("theirs") == []
        [account] = (await env.service.paid.budgets.view())["accounts"]
        assert account["day"] == {
            "period": account["day"]["period"],
            "limit": 1.0,
            "spent": 1.0,
            "reached": True,
        }


async def test_an_account_s_monthly_budget_fails_a_failing_project_s_tasks(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    projects = model()
    projects["proj"]["budget"] = {"on_limit": "fail"}
    projects["proj"]["comfyui"]["budget"] = {"month": 1}
    async with paid_stack(tmp_path, redis, redis_url, model=projects, rh=rh()) as env:
        await spend_then(env, 1)
        await env.client.request(generate("over"))
        await env.client.collect(2, timeout=20)
        [over] = env.client.results["over"]
        assert over["code"] == "BudgetExceeded"
        assert "account runninghub/" in over["error"]["message"]


@pytest.mark.parametrize(("period", "later_s"), [("day", 86400), ("month", 32 * 86400)])
async def test_a_new_period_lifts_the_hold_and_the_waiting_task_is_sent(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, period: str, later_s: float
) -> None:
    async with paid_stack(
        tmp_path, redis, redis_url, model=model(budget={period: 1}), rh=rh()
    ) as env:
        await spend_then(env, 1)
        await waits_held(env, "later")
        before = (await env.service.lifecycle.spend.view(period))["period"]  # type: ignore[arg-type]
        env.service.rt.clock = lambda: time.time() + later_s  # the next day or month (UTC)
        await env.client.collect(2, timeout=30)
        assert env.client.results["later"][0]["status"] == "success"
        assert HOLD not in await holds(env)

        async def project() -> dict[str, Any]:
            [row] = (await env.service.paid.budgets.view())["projects"]
            return dict(row[period])

        # the new period's spend, the one task: charged just after its end is applied
        spent = await until(project, lambda p: p["spent"] == 1.0, within=15)
        assert spent["period"] > before


async def test_two_serve_processes_stay_within_the_bound(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    limit, cap, n = 3, 2, 12
    async with (
        paid_stack(
            tmp_path,
            redis,
            redis_url,
            model=model(concurrency=cap, budget={"day": limit}),
            rh=rh(duration_s=0.3, max_concurrent=cap),
        ) as a,
        serve_beside(a, tmp_path) as b,
    ):
        for i in range(n):
            await (a if i % 2 else b).client.request(generate(f"t{i}"))
        await until(partial(holds, a), lambda h: HOLD in h, within=30)
        keys = a.service.rt.store.keys

        async def settled() -> tuple[int, int]:
            running = await redis.zcard(keys.running("proj", "runninghub"))
            return running, int(await redis.zcard(keys.wait("proj", "comfyui")))

        # nothing runs any more; what was not sent waits in the queue
        _, waiting = await until(settled, lambda s: s[0] == 0 and s[1] > 0, within=30)
        records = await a.records()
        created = len(records[RH_KEY]["creates"])
        # the bound (aigcq.scheduler.budgets): below limit + the creates in flight
        assert limit <= created <= limit - 1 + 2 * cap, created
        assert waiting == n - created


async def test_an_account_s_balance_floor_as_last_polled_stops_its_creates(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    # 15 coins, 10 a task: after one task the account has 5, below its floor of 10
    projects = model(budget={"on_limit": "fail"})
    projects["proj"]["comfyui"]["budget"] = {"balance_floor": 10}
    emulator = rh(remain_coins=15, consume_coins=10)
    async with paid_stack(
        tmp_path, redis, redis_url, model=projects, rh=emulator, reconcile_interval_s=0.2
    ) as env:
        await spend_then(env, 1)
        account = env.service.paid.budgets.account("proj", "comfyui", "runninghub")
        key = env.service.rt.store.keys.paid_account("runninghub", account.account)
        await until(partial(redis.hget, key, "remainCoins"), lambda c: c == "5.0", within=20)
        await env.client.request(generate("poor"))
        await env.client.collect(2, timeout=20)
        [poor] = env.client.results["poor"]
        assert poor["code"] == "BudgetExceeded"
        assert "balance 5.0 at or below its floor 10" in poor["error"]["message"]
        [row] = (await env.service.paid.budgets.view())["accounts"]
        assert (row["remainCoins"], row["floorReached"]) == (5.0, True)
