"""The operator's verbs against a real aigcq (in-process, real Redis, a test bridge):
``aigcq tasks list`` (filters, pages), ``tasks cancel``, ``tasks retry``, ``bridges
drain`` / ``undrain``, and each one's refusals as one line with the server's code
(issue 29 item 6). The server-down and no-token lines are in tests/unit/test_cli_errors.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from click.testing import Result
from typer.testing import CliRunner

from aigcq.cli.app import app
from aigcq.plumbing.auth import ADMIN_TOKEN_HINT, issue_client_token
from tests.fakes.bridge import PROMPT_INVALID, task_end
from tests.fakes.cli import one_error_line
from tests.fakes.client import Client, generate
from tests.fakes.service import ADMIN, SECRET, Env, admin_service
from tests.fakes.waiting import until

CLIENT = issue_client_token(SECRET, "b1")
ADMIN_REFUSED = (
    f"error: AuthError: 认证失败，请检查 token。 (admin token required: {ADMIN_TOKEN_HINT})"
)
MODELS = {
    "proj": {"comfyui": {"apikey": "k", "concurrency": 0}},
    "other": {"comfyui": {"apikey": "k", "concurrency": 0}},
}


@pytest.fixture
async def env(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Env]:
    """Serve with the bridge hub, the admin token, two projects and no paid capacity."""
    async with admin_service(tmp_path, redis, redis_url, json.dumps(MODELS)) as found:
        yield found


async def cli(env: Env, *args: str, token: str = ADMIN) -> Result:
    """``aigcq ARGS --server <env> --token TOKEN`` in a thread (the server runs here)."""
    argv = [*args, "--server", env.base, "--token", token]
    return await asyncio.to_thread(CliRunner().invoke, app, argv, env={"COLUMNS": "300"})


async def listed(env: Env, *args: str) -> list[str]:
    """The ids ``aigcq tasks list ARGS --json`` prints, in order."""
    result = await cli(env, "tasks", "list", "--json", *args)
    assert result.exit_code == 0, result.output
    return [t["taskId"] for t in json.loads(result.stdout)["tasks"]]


async def state(env: Env, task_id: str) -> str:
    return (await env.task(task_id)).state.value


async def client_b2(env: Env) -> Client:
    client = await Client(env.port, "b2", issue_client_token(SECRET, "b2")).connect()
    env.sockets.append(client.ws)
    return client


async def five_tasks(env: Env) -> float:
    """r1 running and f1 failed on the bridge br1 (then drained); waiting: w1 (project
    other, client b2) and w2; c1 cancelled. Returns a time between r1's last change and
    w1's submission."""
    bridge = await env.bridge()
    await bridge.register(count=2)
    b1 = await env.client()
    for task_id in ("r1", "f1"):
        await b1.request(generate(task_id))
        assign = await bridge.next()
        await bridge.ack(task_id)
    assert await task_end(env, assign["data"]["webhookUrl"], failure=PROMPT_INVALID) == 200
    await until(partial(state, env, "f1"), lambda s: s == "failed")
    await until(partial(state, env, "r1"), lambda s: s == "running")
    assert env.service.hub is not None
    await env.service.hub.drain("br1", True)
    await asyncio.sleep(0.01)  # time: the "since" boundary falls after r1's and f1's changes
    between = (await env.task("f1")).updated_at + 0.005
    await (await client_b2(env)).request(generate("w1", aigc="other"))
    await b1.request(generate("w2"))
    await b1.request(generate("c1"))
    async with httpx.AsyncClient(base_url=env.base) as http:
        r = await http.post("/api/tasks/c1/cancel", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 200
    return between


async def test_tasks_list_filters_by_state_project_platform_client_target_since(
    env: Env,
) -> None:
    between = await five_tasks(env)
    assert await listed(env) == ["c1", "w2", "w1", "f1", "r1"]  # the latest change first
    assert await listed(env, "--state", "live") == ["w2", "w1", "r1"]
    assert await listed(env, "--state", "failed,cancelled") == ["c1", "f1"]
    assert await listed(env, "--state", "pending") == ["w2", "w1"]
    assert await listed(env, "--project", "other") == ["w1"]
    assert await listed(env, "--aigc", "proj", "--client", "b1", "--state", "live") == ["w2", "r1"]
    assert await listed(env, "--client", "b2") == ["w1"]
    assert await listed(env, "--platform", "coze") == []
    assert await listed(env, "--target", "bridge") == ["f1", "r1"]
    since = datetime.fromtimestamp(between).isoformat()
    assert await listed(env, "--since", since) == ["c1", "w2", "w1"]
    assert await listed(env, "--since", "1h") == ["c1", "w2", "w1", "f1", "r1"]


async def test_tasks_list_shows_where_since_when_and_why(env: Env) -> None:
    await five_tasks(env)
    result = await cli(env, "tasks", "list")
    assert result.exit_code == 0, result.output
    assert "tasks 1–5 of 5" in result.stdout
    row = next(line for line in result.stdout.splitlines() if line.startswith("f1 "))
    assert "failed" in row and "bridge" in row and "b1" in row
    assert f"PromptValidation (task): {PROMPT_INVALID['message']}" in row
    assert "more:" not in result.stdout


@pytest.mark.parametrize("columns", ["120", "140"])
async def test_tasks_list_never_cuts_a_task_id(env: Env, columns: str) -> None:
    """32-character ids (a UUID's hex), the failure column shown: each id whole, on one
    line, to paste into `tasks show`."""
    bridge = await env.bridge()
    await bridge.register(count=1)
    b1 = await env.client()
    ids = [uuid.uuid4().hex for _ in range(3)]
    for task_id in ids:
        await b1.request(generate(task_id))
        assign = await bridge.next()
        await bridge.ack(task_id)
        assert await task_end(env, assign["data"]["webhookUrl"], failure=PROMPT_INVALID) == 200
        await until(partial(state, env, task_id), lambda s: s == "failed")
    argv = ["tasks", "list", "--server", env.base, "--token", ADMIN]
    invoke = partial(CliRunner().invoke, app, argv, env={"COLUMNS": columns})
    result = await asyncio.to_thread(invoke)
    assert result.exit_code == 0, result.output
    assert "(task):" in result.stdout  # the failure column is shown (PromptValidation)
    assert all(task_id in result.stdout for task_id in ids), result.stdout


async def test_tasks_list_pages(env: Env) -> None:
    await five_tasks(env)
    pages = [await listed(env, "--limit", "2", "--page", str(n)) for n in (1, 2, 3)]
    assert pages == [["c1", "w2"], ["w1", "f1"], ["r1"]]
    first = await cli(env, "tasks", "list", "--limit", "2")
    assert "tasks 1–2 of 5" in first.stdout and "more: --page 2" in first.stdout
    last = await cli(env, "tasks", "list", "--limit", "2", "--page", "3")
    assert "tasks 5–5 of 5" in last.stdout and "more:" not in last.stdout


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--state", "runing"], "error: --state: no state 'runing' (known: pending, "),
        (["--since", "yesterday"], "error: --since: 'yesterday' is no time (30s, 10m"),
        (["--limit", "0"], "error: --limit: 0 is not between 1 and 1000"),
        (["--page", "0"], "error: --page: 0 is not 1 or more"),
    ],
)
async def test_a_bad_filter_is_one_line_and_asks_nothing(
    env: Env, args: list[str], line: str
) -> None:
    assert one_error_line(await cli(env, "tasks", "list", *args), 2).startswith(line)


async def test_the_api_refuses_a_bad_filter_with_json_error(env: Env) -> None:
    async with httpx.AsyncClient(base_url=env.base) as http:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        for query in ("state=runing", "limit=0", "limit=1001", "offset=-1", "since=soon"):
            r = await http.get(f"/api/admin/tasks?{query}", headers=headers)
            assert r.status_code == 400 and r.json()["code"] == "JSONError", (query, r.text)
        r = await http.get("/api/admin/tasks", headers={"Authorization": f"Bearer {CLIENT}"})
        assert r.status_code == 401


async def test_tasks_list_needs_the_admin_token(env: Env) -> None:
    line = one_error_line(await cli(env, "tasks", "list", token=CLIENT), 1)
    assert line == ADMIN_REFUSED


async def test_where_aigcq_up_runs_the_servers_admin_token_comes_before_a_client_token(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in the README's quick tour: AIGCQ_CLIENT_TOKEN holds a client JWT, and the
    server's folder has its secrets file."""
    (tmp_path / ".aigcq").mkdir()
    (tmp_path / ".aigcq" / "secrets.json").write_text(json.dumps({"admin_token": ADMIN}))
    monkeypatch.chdir(tmp_path)
    argv = ["tasks", "list", "--server", env.base]
    run = partial(CliRunner().invoke, app, argv, env={"AIGCQ_CLIENT_TOKEN": CLIENT})
    result = await asyncio.to_thread(run)
    assert result.exit_code == 0, result.output
    assert "tasks 0–0 of 0" in result.stdout


async def test_every_operator_verb_finds_the_servers_admin_token_the_same_way(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where `aigcq up` runs, with a client JWT in AIGCQ_CLIENT_TOKEN (the quick tour):
    status, tasks show and tasks cancel act as the operator, as tasks list does."""
    await (await client_b2(env)).request(generate("theirs"))  # no capacity: it waits
    (tmp_path / ".aigcq").mkdir()
    (tmp_path / ".aigcq" / "secrets.json").write_text(json.dumps({"admin_token": ADMIN}))
    monkeypatch.chdir(tmp_path)

    async def run(*args: str) -> Result:
        argv = [*args, "--server", env.base]
        invoke = partial(CliRunner().invoke, app, argv, env={"AIGCQ_CLIENT_TOKEN": CLIENT})
        result = await asyncio.to_thread(invoke)
        assert result.exit_code == 0, result.output
        return result

    assert "bridges" in (await run("status")).stdout  # a table of the admin snapshot
    assert "task theirs: pending" in (await run("tasks", "show", "theirs")).stdout
    assert (await run("tasks", "cancel", "theirs")).stdout.strip() == "theirs: cancelled"
    assert await state(env, "theirs") == "cancelled"


async def test_tasks_cancel_cancels_and_names_each_refusal(env: Env) -> None:
    b1 = await env.client()
    for task_id in ("k1", "k2", "k3"):
        await b1.request(generate(task_id))  # no capacity: they wait
    ok = await cli(env, "tasks", "cancel", "k1", "k2", token=CLIENT)
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.splitlines() == ["k1: cancelled", "k2: cancelled"]
    assert [await state(env, t) for t in ("k1", "k2", "k3")] == [
        "cancelled",
        "cancelled",
        "pending",
    ]
    mixed = await cli(env, "tasks", "cancel", "nope", "k1", "k3")
    assert mixed.exit_code == 1
    assert mixed.stdout.splitlines() == ["k3: cancelled"]  # the others did not stop it
    assert mixed.stderr.splitlines() == [
        "error: nope: TaskNotFound: 任务不存在。 (no such task)",
        "error: k1: TaskGone: 任务已结束。 (task already cancelled)",
    ]


async def test_a_client_cancels_only_its_own_tasks(env: Env) -> None:
    await (await client_b2(env)).request(generate("theirs"))
    line = one_error_line(await cli(env, "tasks", "cancel", "theirs", token=CLIENT), 1)
    assert line == "error: theirs: TaskNotFound: 任务不存在。 (no such task)"
    assert await state(env, "theirs") == "pending"


async def test_tasks_retry_queues_again_and_names_each_refusal(env: Env) -> None:
    b1 = await env.client()
    for task_id in ("x1", "x2"):
        await b1.request(generate(task_id))
    assert (await cli(env, "tasks", "cancel", "x1")).exit_code == 0
    ok = await cli(env, "tasks", "retry", "x1")
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.strip() == "x1: queued again, as a new attempt"
    assert await state(env, "x1") == "pending"
    refused = await cli(env, "tasks", "retry", "x2", "nope")
    assert refused.exit_code == 1
    assert refused.stderr.splitlines() == [
        "error: x2: TaskNotRetryable: 只有失败或已取消的任务可以重试。 "
        "(a pending task cannot be retried)",
        "error: nope: TaskNotFound: 任务不存在。 (no such task)",
    ]
    line = one_error_line(await cli(env, "tasks", "retry", "x1", token=CLIENT), 1)
    assert line == ADMIN_REFUSED


async def bridge_row(env: Env, bridge_id: str) -> dict[str, Any] | None:
    async with httpx.AsyncClient(base_url=env.base) as http:
        r = await http.get("/api/admin/snapshot", headers={"Authorization": f"Bearer {ADMIN}"})
    return next((b for b in r.json()["bridges"] if b["bridgeId"] == bridge_id), None)


async def test_bridges_drain_and_undrain(env: Env) -> None:
    bridge = await env.bridge()
    await bridge.register(count=1)
    await until(partial(bridge_row, env, "br1"), lambda b: b is not None)
    drained = await cli(env, "bridges", "drain", "br1")
    assert drained.exit_code == 0, drained.output
    assert drained.stdout.strip() == "br1: drained: no new tasks, the ones it runs finish"
    await (await env.client()).request(generate("d1"))
    with pytest.raises(TimeoutError):
        await bridge.next(timeout=0.5)  # nothing assigned while drained
    undrained = await cli(env, "bridges", "undrain", "br1")
    assert undrained.stdout.strip() == "br1: undrained: gets tasks"
    assert (await bridge.next())["data"]["taskId"] == "d1"


async def test_an_unknown_bridge_is_refused_unless_ahead(env: Env) -> None:
    line = one_error_line(await cli(env, "bridges", "drain", "br-1"), 1)
    assert line == "error: BridgeNotFound: 桥接节点不存在。 (no bridge 'br-1' ever connected)"
    assert env.service.hub is not None and "br-1" not in env.service.hub.registry.drained
    ahead = await cli(env, "bridges", "drain", "br9", "--ahead")
    assert (
        ahead.stdout.strip() == "br9: drained ahead: it has never connected; kept for when it does"
    )
    bridge = await env.bridge()
    await bridge.register("br9", count=1)
    row = await until(partial(bridge_row, env, "br9"), lambda b: b is not None)
    assert row is not None and row["drained"]
    line = one_error_line(await cli(env, "bridges", "undrain", "br1", token=CLIENT), 1)
    assert line.startswith("error: AuthError: ")


def instances(*ids: str) -> list[dict[str, Any]]:
    return [{"instanceId": i, "url": f"http://{i}", "state": "idle"} for i in ids]


async def test_a_replaced_bridge_leaves_the_picture_and_one_gone_is_offline(env: Env) -> None:
    """A bridge restarted under a new id on the same machine (its ComfyUI instances now the
    new one's) is not listed as an offline bridge in rotation beside it; a bridge that left
    and was not replaced is listed offline, out of rotation, until its record expires
    (issue 41 §2)."""
    old = await env.bridge()
    await old.register("br-old", count=2, instances=instances("gpu:8188", "gpu:8189"))
    gone = await env.bridge()
    await gone.register("br-gone", count=1, instances=instances("other:8188"))
    await until(partial(bridge_row, env, "br-gone"), lambda b: b is not None)
    await old.ws.close()
    await gone.ws.close()
    await until(partial(bridge_row, env, "br-old"), lambda b: b is not None and not b["online"])
    new = await env.bridge()
    await new.register("br-new", count=2, instances=instances("gpu:8188", "gpu:8189"))
    await until(partial(bridge_row, env, "br-new"), lambda b: b is not None and b["online"])
    assert await bridge_row(env, "br-old") is None  # replaced by br-new
    left = await bridge_row(env, "br-gone")
    assert left is not None and not left["online"] and not left["inRotation"]
    ttl = await env.redis.ttl(env.service.rt.store.keys.bridge("br-gone"))
    assert 0 < ttl <= 600  # it leaves the picture with its record
    status = await cli(env, "status")
    assert "br-old" not in status.stdout and "br-new" in status.stdout, status.stdout
