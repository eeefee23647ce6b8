"""``aigcq pause`` / ``resume`` and ``aigcq tasks cancel`` / ``retry`` with filters, against
a real serve process (issue 29 item 5): each verb, and each mistake as one line."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from typer.testing import CliRunner, Result

from aigcq.cli.app import app
from aigcq.cli.remote import InputError
from aigcq.cli.tasks import since_time
from aigcq.domain import TaskState
from tests.fakes.client import generate
from tests.fakes.paid import Paid, models, paid_stack
from tests.fakes.waiting import until

ADMIN = "cli-controls-admin"


async def aigcq(env: Paid, *args: str) -> Result:
    argv = [*args, "--server", env.base, "--token", ADMIN]
    run = partial(CliRunner().invoke, app, argv, env={"COLUMNS": "300"})
    return await asyncio.to_thread(run)


async def test_pause_resume_and_the_list_of_pauses(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with paid_stack(tmp_path, redis, redis_url, admin_token=ADMIN) as env:
        assert (await aigcq(env, "pause")).stdout.strip() == "nothing is paused"
        out = await aigcq(env, "pause", "project", "proj", "--note", "incident 7")
        assert out.exit_code == 0 and "project proj paused on every server" in out.stdout
        again = await aigcq(env, "pause", "project", "proj")
        assert again.stdout.strip() == "project proj was paused already"
        await aigcq(env, "pause", "account", "proj/comfyui")
        listed = (await aigcq(env, "pause")).stdout
        assert "account proj/runninghub  paused since" in listed
        assert "project proj  paused since" in listed and "(incident 7)" in listed
        out = await aigcq(env, "resume", "project", "proj")
        assert "project proj resumed: its waiting tasks are dispatched" in out.stdout
        assert "project proj" not in (await aigcq(env, "pause")).stdout


async def test_cancel_and_retry_by_filter(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with paid_stack(
        tmp_path, redis, redis_url, model=models(concurrency=0), admin_token=ADMIN
    ) as env:
        for task_id in ("k1", "k2"):
            await env.client.request(generate(task_id))  # no capacity: they wait
        dry = await aigcq(env, "tasks", "cancel", "--project", "proj", "--dry-run")
        assert "would cancel 2 task(s): k1, k2" in dry.stdout
        assert (await env.task("k1")).state is TaskState.PENDING
        out = await aigcq(env, "tasks", "cancel", "--project", "proj", "--since", "1h")
        assert out.exit_code == 0 and "cancelled: k1, k2" in out.stdout
        assert (await aigcq(env, "tasks", "retry", "--project", "proj")).stdout.strip() == (
            "no task matches"  # failed ones, by default
        )
        out = await aigcq(env, "tasks", "retry", "--cancelled", "--client", "b1", "--limit", "1")
        assert "queued again: k1" in out.stdout and "1 more match" in out.stdout
        await until(partial(env.task, "k1"), lambda t: t.state is TaskState.PENDING)


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (("pause", "queue", "proj"), 2, "queue"),
        (("pause", "project"), 2, "missing NAME"),
        (
            ("pause", "project", "nope"),
            1,
            "ControlError: 管理操作无效，请检查参数。 (no project 'nope'",
        ),
        (("resume", "account", "jimuai"), 1, "no paid account 'jimuai'"),
        (("tasks", "cancel"), 2, "name task ids, or filters: at least one of --state, --project"),
        (("tasks", "retry"), 2, "name task ids, or filters: at least one of --failed"),
        (("tasks", "cancel", "t1", "--project", "proj"), 2, "task ids or filters, not both"),
        (
            ("tasks", "cancel", "--project", "proj", "--since", "yesterday"),
            2,
            "--since: 'yesterday'",
        ),
        (("tasks", "cancel", "--state", "success"), 1, "state 'success': this acts on"),
        (("tasks", "retry", "--project", "proj", "--limit", "0"), 2, "--limit: 0"),
    ],
)
async def test_each_mistake_is_one_line_and_changes_nothing(
    tmp_path: Path,
    redis: aioredis.Redis,
    redis_url: str,
    args: tuple[str, ...],
    code: int,
    says: str,
) -> None:
    async with paid_stack(tmp_path, redis, redis_url, admin_token=ADMIN) as env:
        out = await aigcq(env, *args)
        assert out.exit_code == code, out.output
        assert says in out.output, out.output
        assert await redis.hgetall(env.service.rt.store.keys.pauses) == {}


def test_since_takes_ago_a_local_time_or_an_iso_time() -> None:
    now = 1_800_000_000.0
    assert since_time("10m", now) == now - 600
    assert since_time("1.5h", now) == now - 5400
    assert since_time("2026-01-31T14:05:00+00:00", now) == 1769868300.0
    assert since_time("14:05", now) < now + 86400
    with pytest.raises(InputError, match="is no time"):
        since_time("soon", now)


def queue_line(out: str, aigc: str) -> str:
    """The row of ``aigcq status``'s queues table for project ``aigc``."""
    return next(line for line in out.splitlines() if f"│ {aigc} " in line and "comfyui" in line)


async def test_status_shows_what_holds_a_queue_next_to_it(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """A paused project's waiting tasks with free paid capacity: `aigcq status` says the
    pause holds them, on the project's queue; an account's pause and a drain too (issue 41
    §2)."""
    async with paid_stack(tmp_path, redis, redis_url, admin_token=ADMIN) as env:
        await aigcq(env, "pause", "project", "proj", "--note", "deploy")
        for i in range(5):
            await env.client.request(generate(f"held-{i}"))
        await until(partial(env.task, "held-4"), lambda t: t.state is TaskState.PENDING)
        status = await aigcq(env, "status")
        assert status.exit_code == 0, status.output
        row = queue_line(status.stdout, "proj")
        assert " 5 " in row and "project proj paused (deploy)" in row, status.stdout
        await aigcq(env, "pause", "account", "proj/comfyui")
        row = queue_line((await aigcq(env, "status")).stdout, "proj")
        assert "account proj/runninghub paused" in row
        async with httpx.AsyncClient(base_url=env.base) as http:  # what the dashboard reads
            headers = {"Authorization": f"Bearer {ADMIN}"}
            snapshot = (await http.get("/api/admin/snapshot", headers=headers)).json()
        [queue] = [
            q for q in snapshot["queues"] if (q["AIGC"], q["platform"]) == ("proj", "comfyui")
        ]
        assert queue["heldBy"] == [
            "account proj/runninghub paused",
            "project proj paused (deploy)",
        ]
