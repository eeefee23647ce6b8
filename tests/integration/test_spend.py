"""Issue 28 item 2, real spend: each paid task's cost from its platform's answer, in Redis
per project, account and workflow (day and month), on /metrics and in the admin snapshot.
A real service and the emulators; RunningHub's reports ``consumeCoins`` / ``consumeMoney``
/ ``taskCostTime`` in its outputs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from aigcq.domain import Task, TaskState
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from aigcq.platforms.base import Cost, Failed, Succeeded
from aigcq.scheduler.spend import SpendLedger, due_cost
from tests.fakes.client import generate
from tests.fakes.paid import (
    COZE_KEY,
    RH_KEY,
    Paid,
    expire_now,
    jimuai_account,
    jimuai_config,
    models,
    paid_stack,
)
from tests.fakes.waiting import until

ADMIN = "spend-admin-token"
PRICES = {"runninghub": 0.1, "coze": 0.3, "jimuai": 0.2}


def model() -> dict[str, Any]:
    projects = models()
    projects["proj"]["jimuai"] = jimuai_account()
    return projects


async def admin(env: Paid, path: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=env.base) as http:
        return await http.get(path, headers={"Authorization": f"Bearer {ADMIN}"})


async def scrape(env: Paid) -> dict[str, float]:
    """``/metrics``: each sample's value by its name and labels."""
    text = (await admin(env, "/metrics")).text
    lines = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {name: float(value) for name, value in lines}


def row(rows: list[dict[str, Any]], **match: str) -> dict[str, Any]:
    [found] = [r for r in rows if all(r[k] == v for k, v in match.items())]
    return found


async def test_each_paid_task_s_cost_is_recorded_per_project_account_and_workflow(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    rh = RunningHubEmulatorConfig(duration_s=0.2, consume_coins=12, consume_money=0.35)
    async with paid_stack(
        tmp_path,
        redis,
        redis_url,
        model=model(),
        rh=rh,
        jm=jimuai_config(outputs=3),
        overflow_price=PRICES,
        admin_token=ADMIN,
    ) as env:
        before = await scrape(env)
        await env.client.request(generate("rh1"))  # no bridge: RunningHub runs it
        await env.client.request(generate("cz1", platform="coze", workflow_id="wf-c"))
        await env.client.request(generate("jm1", platform="jimuai", prompt="three foxes"))
        await env.client.collect(3, timeout=20)
        assert {r[0]["status"] for r in env.client.results.values()} == {"success"}

        ledger = SpendLedger(env.service.rt)  # any process reads the same figures
        rh_account = env.service.rt.platforms.adapters["runninghub"].account_id(RH_KEY)
        coze_account = env.service.rt.platforms.adapters["coze"].account_id(COZE_KEY)
        day = await until(lambda: ledger.view("day"), lambda d: d["total"]["tasks"] == 3)
        workflows = day["workflows"]
        rh_row = row(workflows, target="runninghub", workflow="1904136902449209346")
        assert rh_row == {
            "AIGC": "proj",
            "target": "runninghub",
            "account": rh_account,
            "workflow": "1904136902449209346",
            "amount": pytest.approx(0.35),  # RunningHub's consumeMoney, not the price
            "estimated": 0.0,
            "coins": 12.0,
            "seconds": pytest.approx(0.0, abs=1),
            "tasks": 1,
        }
        cz = row(workflows, target="coze")
        assert (cz["account"], cz["workflow"], cz["amount"], cz["estimated"]) == (
            coze_account,
            "wf-c",
            pytest.approx(0.3),  # no money figure from Coze: the price, an estimate
            pytest.approx(0.3),
        )
        jm = row(workflows, target="jimuai")
        assert (jm["account"], jm["workflow"], jm["amount"]) == (
            "AKLTpaid",
            "jimeng_t2i_v40",
            pytest.approx(0.6),  # three images at 0.2
        )
        assert day["total"]["amount"] == pytest.approx(1.25)
        assert day["total"]["estimated"] == pytest.approx(0.9)
        assert row(day["projects"], AIGC="proj")["tasks"] == 3
        assert row(day["accounts"], target="runninghub")["coins"] == 12
        month = await ledger.view("month")
        assert month["total"] == day["total"]

        # the task keeps what it cost
        keys = env.service.rt.store.keys
        cost = await env.service.rt.redis.hget(keys.task("rh1"), "cost")
        assert '"amount":0.35' in cost and '"estimate":false' in cost

        # the process's counters (other tests of this process add to them too: deltas)
        after = await scrape(env)
        rh_labels = f'account="{rh_account}",aigc="proj"'
        grew = {
            f'aigcq_spend_total{{{rh_labels},basis="reported",target="runninghub"}}': 0.35,
            f'aigcq_spend_coins_total{{{rh_labels},target="runninghub"}}': 12,
            f'aigcq_spend_total{{account="{coze_account}",aigc="proj",basis="estimate",'
            'target="coze"}': 0.3,
            'aigcq_overflow_cost_total{target="jimuai"}': 0.6,
        }
        for sample, amount in grew.items():
            assert after.get(sample, 0) - before.get(sample, 0) == pytest.approx(amount), sample

        snap = (await admin(env, "/api/admin/snapshot")).json()
        assert snap["spend"]["day"]["total"]["amount"] == pytest.approx(1.25)
        assert snap["spend"]["month"]["period"] == day["period"][:7]


async def test_a_failed_paid_task_is_charged_the_price_as_an_estimate(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    rh = RunningHubEmulatorConfig(duration_s=0.1, failure_rate=1.0)
    async with paid_stack(
        tmp_path, redis, redis_url, rh=rh, overflow_price=PRICES, admin_token=ADMIN
    ) as env:
        await env.client.request(generate("bad"))
        await env.client.collect(1, timeout=20)
        assert env.client.results["bad"][0]["status"] == "failed"
        ledger = SpendLedger(env.service.rt)  # the charge lands just after the end
        day = await until(lambda: ledger.view("day"), lambda d: d["total"]["tasks"] == 1)
        assert day["total"] == {
            "amount": pytest.approx(0.1),
            "estimated": pytest.approx(0.1),
            "coins": 0.0,
            "seconds": 0.0,
            "tasks": 1,
        }


async def test_a_run_no_longer_wanted_is_charged_when_the_platform_says_it_ended(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    # JimuAI has no cancel: a cancelled task runs on to its end there, billed all the same
    model = {"proj": {"jimuai": jimuai_account()}}
    async with paid_stack(
        tmp_path,
        redis,
        redis_url,
        model=model,
        jm=jimuai_config(duration_s=1.0, outputs=2),
        overflow_price=PRICES,
    ) as env:
        await env.client.request(generate("gone", platform="jimuai", prompt="two foxes"))
        await until(partial(env.task, "gone"), lambda t: t.state is TaskState.RUNNING)
        await env.service.gateway.cancel("gone", None)
        ledger = SpendLedger(env.service.rt)
        day = await until(lambda: ledger.view("day"), lambda d: d["total"]["tasks"] == 1)
        assert day["total"]["amount"] == pytest.approx(0.4)  # its two images
        keys = env.service.rt.store.keys
        assert await env.service.rt.redis.hget(keys.task("gone"), "cost") is None  # no result
        await asyncio.sleep(0.5)  # time: more orphan checks (every 2 s; sweeps every 0.1 s)
        assert (await ledger.view("day"))["total"]["tasks"] == 1  # charged once


# ---- issue 42 item 3: a run that ends after its task stopped wanting it ------------------

NO_RECHECK = {"sweep_interval_s": 3600}  # no orphan check: what the webhooks alone do


async def test_a_cancelled_runs_own_webhook_charges_it_once(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """The client cancels a running paid task; RunningHub ends the run and its TASK_END
    comes back (410: the task is over). That run was billed: it is in the day's spend
    once, however often RunningHub repeats the webhook."""
    rh = RunningHubEmulatorConfig(duration_s=60, max_concurrent=5)
    async with paid_stack(
        tmp_path, redis, redis_url, rh=rh, overflow_price=PRICES, **NO_RECHECK
    ) as env:
        await env.cancel_running("c1")
        ledger = SpendLedger(env.service.rt)
        day = await until(lambda: ledger.view("day"), lambda d: d["total"]["tasks"] == 1)
        assert day["total"]["amount"] == pytest.approx(0.1)  # a failure: the price
        failed = {"code": 805, "msg": "APIKEY_TASK_STATUS_ERROR", "data": None}
        assert await env.post_task_end("c1", 1, failed, here=True) == 410  # a repeat
        assert (await ledger.view("day"))["total"]["tasks"] == 1


async def test_a_superseded_runs_webhook_is_charged_beside_the_winner(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Attempt 1 is given up at its deadline and sent again; its late success wins, and
    attempt 2 (now unwanted) is cancelled and ends by its own webhook. RunningHub billed
    both runs: both are charged, each once."""
    rh = RunningHubEmulatorConfig(duration_s=1.5, max_concurrent=5, consume_money=0.35)
    async with paid_stack(
        tmp_path, redis, redis_url, rh=rh, overflow_price=PRICES, **NO_RECHECK
    ) as env:
        store = env.service.rt.store
        await env.client.request(generate("s1"))
        await until(partial(env.task, "s1"), lambda t: t.state is TaskState.RUNNING)
        await expire_now(env, "s1")
        await env.service.sweeper._expire("s1")  # still running: retried, run 1 counted

        async def promoted() -> Task:
            await store.promote_delayed()
            return await env.task("s1")

        await until(promoted, lambda t: t.attempt == 2)
        await env.client.collect(1, timeout=20)
        assert env.client.results["s1"][0]["status"] == "success"
        ledger = SpendLedger(env.service.rt)
        day = await until(lambda: ledger.view("day"), lambda d: d["total"]["tasks"] == 2)
        assert day["total"]["amount"] == pytest.approx(0.35 + 0.1)  # its success, the cancel


@asynccontextmanager
async def running_paid(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, task_id: str
) -> AsyncIterator[tuple[Paid, Task]]:
    """A paid stack whose RunningHub runs ``task_id`` (for a minute), once it runs."""
    rh = RunningHubEmulatorConfig(duration_s=60, max_concurrent=5)
    async with paid_stack(
        tmp_path, redis, redis_url, rh=rh, overflow_price=PRICES, **NO_RECHECK
    ) as env:
        await env.client.request(generate(task_id))
        yield env, await until(partial(env.task, task_id), lambda t: t.state is TaskState.RUNNING)


async def test_a_charge_left_due_by_a_process_that_died_is_made_once_by_the_sweep(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """The end that bills a run makes its charge due in the same step; a process that dies
    right after (before it charges) leaves it due, and the sweep makes it, once, in the
    period the run ended in, with the cost the platform reported."""
    async with running_paid(tmp_path, redis, redis_url, "d1") as (env, task):
        rt = env.service.rt
        reported = Cost(money=0.7, coins=20, seconds=3.0)
        # what the webhook's settle does, up to its death: the end applied, nothing charged
        done = await rt.store.finish(
            "d1",
            TaskState.SUCCESS,
            result=[],
            from_attempt=task.attempt,
            ended=True,
            cost=due_cost(Succeeded([], cost=reported)),
        )
        assert done.applied
        ledger = SpendLedger(rt)
        assert (await ledger.view("day"))["total"].get("tasks", 0) == 0
        assert await ledger.charge_overdue(grace_s=3600) == 0  # not overdue yet
        charged = await asyncio.gather(*(ledger.charge_overdue(grace_s=0) for _ in range(3)))
        assert sum(charged) == 1  # three sweeps at once (two serves and more): one charge
        day = (await ledger.view("day"))["total"]
        assert (day["tasks"], day["amount"], day["coins"]) == (1, pytest.approx(0.7), 20.0)
        assert orjson.loads(await rt.redis.hget(rt.store.keys.task("d1"), "cost"))["amount"] == 0.7
        assert await redis.zcard(rt.store.keys.dues) == 0
        assert await ledger.charge_due("d1") == 0  # and never again


async def test_a_retried_paid_failure_is_charged_with_its_requeue(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """A paid run that failed and is retried was billed: its charge is due with the
    requeue (the same step), charged once though the retry runs on."""
    async with running_paid(tmp_path, redis, redis_url, "r1") as (env, task):
        rt = env.service.rt
        failed = due_cost(Failed("805", "boom", cost=Cost(money=0.2)))
        assert await rt.store.requeue_for_retry("r1", task.attempt, "failed", cost=failed)
        ledger = SpendLedger(rt)
        assert await ledger.charge_due("r1") == 1
        assert await ledger.charge_due("r1") == 0
        assert (await ledger.view("day"))["total"]["amount"] == pytest.approx(0.2)
