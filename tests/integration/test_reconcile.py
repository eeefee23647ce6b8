"""Issue 28 item 1, reconciliation, through a real service, Redis and the RunningHub
emulator: the platform's count of an account's live tasks (accountStatus) against ours,
both ways. The platform counting more (ghost tasks) holds the account after the grace and
names the suspects; we counting more (a lost webhook) is settled once the platform says the
task ended. Shown in the admin snapshot, /metrics and ``aigcq status``; one process polls
per interval across two; a failing poll backs off."""

from __future__ import annotations

import itertools
import logging
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from rich.console import Console

from aigcq.cli.status import render
from aigcq.domain import TaskState
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from tests.fakes.client import generate
from tests.fakes.paid import Paid, models, paid_stack, serve_beside
from tests.fakes.waiting import until

ADMIN = "reconcile-admin"
HOLD = "hold:drift:proj/runninghub"
FAST = {"reconcile_interval_s": 0.3, "reconcile_grace_s": 1.0, "admin_token": ADMIN}


async def snapshot(env: Paid) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=env.base) as http:
        reply = await http.get("/api/admin/snapshot", headers={"Authorization": f"Bearer {ADMIN}"})
        found: dict[str, Any] = reply.json()
        return found


async def account(env: Paid) -> dict[str, Any]:
    [row] = (await snapshot(env))["accounts"]
    return row


async def holds(env: Paid) -> dict[str, Any]:
    return dict(await env.service.rt.redis.hgetall(env.service.rt.store.keys.pauses))


async def test_the_platform_counting_more_holds_the_account_and_names_the_suspects(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aigcq.scheduler.accounts")
    rh = RunningHubEmulatorConfig(duration_s=60)
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, **FAST) as env:
        # a create the platform took whose reply was lost: ours, outcome unknown
        await env.faults(drop_create_replies=1, ghost_tasks=2)
        await env.client.request(generate("lost-reply"))
        row = await until(partial(account, env), lambda a: a["drift"] == 2, within=20)
        assert (row["theirs"], row["ours"]) == (3, 1), row
        assert [s["taskId"] for s in row["suspects"]] == ["lost-reply"]
        found = await until(partial(holds, env), lambda h: HOLD in h, within=20)
        assert "lost-reply" in found[HOLD] and "2 task(s) more" in found[HOLD]
        logged = [
            r.getMessage() for r in caplog.records if "suspects: lost-reply" in r.getMessage()
        ]
        assert any("past the grace" in m for m in logged), logged
        await env.client.request(generate("held"))  # no new create on the account
        await until(partial(env.task, "held"), lambda t: t.state is TaskState.PENDING)
        assert await env.creates("held") == []
        async with httpx.AsyncClient(base_url=env.base) as http:
            text = (await http.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"})).text
        assert 'aigcq_paid_account_drift{account="' in text
        assert 'aigcq_paid_holds{aigc="proj",cause="drift",target="runninghub"} 1.0' in text
        await env.faults(ghost_tasks=0)  # the ghosts end: the hold is lifted, "held" is sent
        await until(partial(holds, env), lambda h: HOLD not in h, within=20)
        await until(partial(env.creates, "held"), bool, within=20)


async def test_we_counting_more_is_settled_once_the_platform_says_the_task_ended(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    # webhooks go nowhere and no silence check comes in time: only reconciliation settles it
    dead = "http://127.0.0.1:9"
    settings = FAST | {"callback_url": dead, "paid_silence_s": 3600}
    rh = RunningHubEmulatorConfig(duration_s=0.2, webhook_retries=0)
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, **settings) as env:
        await env.client.request(generate("stale"))
        await env.client.collect(1, timeout=30)
        assert env.client.results["stale"][0]["status"] == "success"
        timeline = await env.service.rt.store.reads.timeline("stale")
        assert any("fewer on its account" in e["note"] for e in timeline), timeline
        row = await until(partial(account, env), lambda a: a["ours"] == 0, within=20)
        assert (row["theirs"], row["drift"]) == (0, 0)


async def test_a_failing_poll_backs_off_and_the_status_table_shows_both_counts(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with paid_stack(tmp_path, redis, redis_url, **FAST) as env:
        await env.faults(account_status_faults=2)
        failed = await until(partial(account, env), lambda a: a["failures"] >= 1, within=20)
        assert "account status" in failed["error"]
        row = await until(partial(account, env), lambda a: a["polledAt"] is not None
                          and a["failures"] == 0, within=30)  # fmt: skip
        assert (row["theirs"], row["ours"], row["remainCoins"]) == (0, 0, 177814.0)
        async with httpx.AsyncClient(base_url=env.base) as http:
            headers = {"Authorization": f"Bearer {ADMIN}"}
            own = (await http.get("/api/admin/accounts", headers=headers)).json()
            assert own["accounts"] == [row] and own["budgets"]["timezone"] == "UTC"
            assert (await http.get("/api/admin/accounts")).status_code == 401
        snap = await snapshot(env)
        snap["recent"] = []
        console = Console(width=200, record=True)
        console.print(render(snap))
        out = console.export_text()
        assert "paid accounts (reconciled)" in out and row["account"] in out


async def test_two_serve_processes_poll_once_per_interval(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    settings = FAST | {"reconcile_interval_s": 1.0}
    async with (
        paid_stack(tmp_path, redis, redis_url, model=models(), **settings) as a,
        serve_beside(a, tmp_path),
    ):
        url = f"{a.urls['runninghub']}/_emulator/stats"

        async def times() -> list[float]:
            async with httpx.AsyncClient() as http:
                stats = (await http.get(url)).json()
            found: list[float] = stats["account_status_times"]
            return found

        seen = await until(times, lambda t: len(t) >= 5, within=30)
        gaps = [later - earlier for earlier, later in itertools.pairwise(seen)]
        # two processes each polling would ask twice per interval, moments apart
        assert min(gaps) > 0.5, gaps
