"""Why a task failed, wherever a task is shown: ``GET /api/tasks/{id}``, the recent lists
(``GET /api/tasks``, the admin snapshot), ``aigcq tasks show`` and ``aigcq status`` give
its class, code and message (issue 29 item 1)."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import httpx
from typer.testing import CliRunner

from aigcq.cli.app import app
from aigcq.plumbing.auth import issue_client_token
from tests.fakes.bridge import PROMPT_INVALID, task_end
from tests.fakes.client import generate
from tests.fakes.service import ADMIN, SECRET, Env, admin_env
from tests.fakes.waiting import until

__all__ = ["admin_env"]  # a fixture: imported for pytest to find

CLIENT = issue_client_token(SECRET, "b1")
FAILURE = {**PROMPT_INVALID}  # class, code and message, as the API gives them
SHOWN = f"PromptValidation (task): {PROMPT_INVALID['message']}"


async def fail_on_a_bridge(env: Env, task_id: str) -> None:
    """``task_id`` runs on a bridge, which reports ComfyUI refusing its prompt."""
    bridge = await env.bridge()
    await bridge.register(count=1)
    client = await env.client()
    await client.request(generate(task_id))
    assign = await bridge.next()
    await bridge.ack(task_id)
    assert await task_end(env, assign["data"]["webhookUrl"], failure=PROMPT_INVALID) == 200
    await until(partial(env.task, task_id), lambda t: t.state == "failed")


async def get(env: Env, path: str, token: str) -> Any:
    async with httpx.AsyncClient(base_url=env.base) as http:
        r = await http.get(path, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return r.json()


async def cli(*args: str) -> str:
    run = partial(CliRunner().invoke, app, list(args), env={"COLUMNS": "400"})
    result = await asyncio.to_thread(run)
    assert result.exit_code == 0, result.output
    return result.stdout


async def test_the_api_gives_the_failures_class_code_and_message(admin_env: Env) -> None:
    await fail_on_a_bridge(admin_env, "bad1")
    task = await get(admin_env, "/api/tasks/bad1", CLIENT)
    assert task["failure"] == FAILURE
    [row] = await get(admin_env, "/api/tasks", CLIENT)
    assert row["taskId"] == "bad1" and row["failure"] == FAILURE
    [snap_row] = (await get(admin_env, "/api/admin/snapshot", ADMIN))["recent"]
    assert snap_row["failure"] == FAILURE


async def test_tasks_show_says_why_a_task_failed(admin_env: Env) -> None:
    await fail_on_a_bridge(admin_env, "bad2")
    out = await cli("tasks", "show", "bad2", "--server", admin_env.base, "--token", CLIENT)
    assert "task bad2: failed (proj / comfyui)" in out
    assert f"failure: {SHOWN}" in out, out


async def test_status_lists_the_recent_failures_with_their_reasons(admin_env: Env) -> None:
    await fail_on_a_bridge(admin_env, "bad3")
    for token in (ADMIN, CLIENT):  # the admin snapshot, and a client's queues and recent
        out = await cli("status", "--server", admin_env.base, "--token", token)
        failures = out.split("recent failures", 1)[1]
        assert "bad3" in failures and SHOWN in failures, out
