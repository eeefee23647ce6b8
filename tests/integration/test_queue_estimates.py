"""Position and ETA for every submitter (issue 27 item 4), through a real serve process,
a real Redis and fake bridges: the submit replies, QUEUE_UPDATE when a task ahead
finishes, the HTTP task view and ``aigcq tasks show``; a seed-format client unharmed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis
import websockets
from typer.testing import CliRunner

from aigcq.bridges.hub import HubConfig
from aigcq.cli.app import app
from aigcq.config import PlatformConfig, Settings
from aigcq.plumbing.auth import issue_client_token
from aigcq.serve.server import ServeProcess
from tests.fakes.bridge import BRIDGE_TOKEN, task_end
from tests.fakes.client import Client, generate
from tests.fakes.servers import serve_app
from tests.fakes.service import NO_PAID, SECRET, Env
from tests.fakes.waiting import until

TOKEN = issue_client_token(SECRET, "b1")
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@contextlib.asynccontextmanager
async def served(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, every_s: float = 3600, **more: Any
) -> AsyncIterator[Env]:
    """Serve with the bridge hub and no paid capacity; the estimates are refreshed by the
    test (:func:`refresh`), so none comes between two steps it checks (or every
    ``every_s``). The default run time is set, as an operator who knows it would: an ETA
    has that basis before any run is recorded."""
    (tmp_path / "model.json").write_text(NO_PAID)
    default_run_s = more.pop("share_default_run_s", 10.0)  # None: not set
    if default_run_s is not None:
        more["share_default_run_s"] = default_run_s
    settings = Settings(
        redis_url=redis_url,
        token_secret=SECRET,
        config_dir=tmp_path,
        bridge_token=BRIDGE_TOKEN,
        eta_interval_s=every_s,
        queue_update_interval_s=0.0,
        **more,
    )
    service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
    assert service.hub is not None
    service.hub.config = HubConfig(ack_timeout_s=5.0)
    async with serve_app(service.app) as base:
        env = Env(int(base.rsplit(":", 1)[1]), redis, service)
        await refresh(env)
        yield env
        for ws in env.sockets:
            await ws.close()


@pytest.fixture
async def eta_env(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Env]:
    async with served(tmp_path, redis, redis_url) as env:
        yield env


async def task_view(env: Env, task_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=env.base) as http:
        r = await http.get(f"/api/tasks/{task_id}", headers=AUTH)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def refresh(env: Env) -> int:
    """One round of the estimates (what the loop does every ``AIGCQ_ETA_INTERVAL_S``): how
    many QUEUE_UPDATE messages it sent."""
    return await env.service.gateway.queue_updates.round()


async def update_of(env: Env, client: Client, task_id: str) -> dict[str, Any]:
    """The QUEUE_UPDATE about ``task_id`` that a round sends once the change has happened
    (rounds until then)."""

    async def probe() -> dict[str, Any] | None:
        await refresh(env)
        with contextlib.suppress(TimeoutError):
            return await client.update(task_id, timeout=0.5)
        return None

    update = await until(probe, lambda u: u is not None, within=30)
    assert update is not None
    return update


async def test_replies_updates_and_the_task_view_tell_where_a_task_stands(eta_env: Env) -> None:
    env = eta_env
    bridge = await env.bridge()
    await bridge.register(count=1)
    client = await env.client()
    first = await client.request(generate("e0"))
    assign = await bridge.next()
    await bridge.ack("e0")
    await until(lambda: env.task("e0"), lambda t: t.state == "running")
    await refresh(env)  # e0 is seen running: the one slot is busy for ~10 s (no mean yet)
    replies = [await client.request(generate(f"e{i}")) for i in (1, 2)]
    assert first["type"] == "submitted" and first["position"] is not None
    now_ms = time.time() * 1000
    assert [r["position"] for r in replies] == [0, 1]
    eta1, eta2 = (r["etaStartMs"] for r in replies)
    assert now_ms < eta1 < eta2, replies  # after e0's run, and one more run
    assert eta2 - eta1 > 5_000  # the default run time assumed (AIGCQ_SHARE_DEFAULT_RUN_S) apart
    view = await task_view(env, "e2")
    assert view["state"] == "pending" and view["position"] == 1
    assert abs(view["etaStartMs"] - eta2) < 5_000

    assert await task_end(env, assign["data"]["webhookUrl"]) == 200  # e0 ends: e1 runs next
    await bridge.next()  # e1's TASK_ASSIGN
    await bridge.ack("e1")
    await until(lambda: env.task("e1"), lambda t: t.state == "running")
    update = await update_of(env, client, "e2")
    assert update["type"] == "QUEUE_UPDATE" and update["position"] == 0
    assert update["etaStartMs"] < eta2 - 5_000  # e0's real run time is now e1's mean
    assert sorted(update) == ["etaStartMs", "position", "taskId", "type"]
    assert "e0" not in [u["taskId"] for u in client.updates]  # nothing about tasks that left
    runs = await env.redis.hgetall(env.service.rt.store.keys.runs)  # the scheduler's means
    assert list(runs) == ["1904136902449209346"]

    shown = await asyncio.to_thread(
        partial(CliRunner().invoke, app, ["tasks", "show", "e2", "--server", env.base,
                "--token", TOKEN], env={"COLUMNS": "200"})
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert "position: 0 ahead; expected start " in shown.stdout, shown.stdout
    done = await task_view(env, "e0")
    assert (done["position"], done["etaStartMs"]) == (None, None)  # not waiting: no estimate


async def test_the_http_submit_reply_carries_them_and_no_capacity_means_no_eta(
    eta_env: Env,
) -> None:
    body = {"taskId": "h1", "platform": "comfyui", "AIGC": "proj", "backendId": "b1",
            "payload": {"workflowId": "w", "nodeInfoList": []}}  # fmt: skip
    async with httpx.AsyncClient(base_url=eta_env.base) as http:
        replies = []
        for task_id in ("h1", "h2", "h3"):
            if task_id == "h3":  # h1 and h2 seen waiting: h3 is placed behind them
                await refresh(eta_env)
            r = await http.post("/api/tasks", json={**body, "taskId": task_id}, headers=AUTH)
            assert r.status_code == 202, r.text
            replies.append(r.json())
        again = (await http.post("/api/tasks", json=body, headers=AUTH)).json()
    assert [(r["position"], r["etaStartMs"]) for r in replies] == [(0, None), (1, None), (2, None)]
    assert again["duplicate"] is True and (again["position"], again["etaStartMs"]) == (0, None)
    view = await task_view(eta_env, "h2")
    assert (view["position"], view["etaStartMs"]) == (1, None)  # no bridge: no GPU of ours


async def test_a_seed_format_client_reads_its_replies_and_results_as_before(
    eta_env: Env,
) -> None:
    """The seed's client: ``token`` and ``id`` only, a generate as seed 001 writes it; the
    reply keeps its fields, the QUEUE_UPDATE it may get has no ``result`` or ``error`` (the
    fields a seed client reads a result by) and a ``type`` it does not know."""
    env = eta_env
    bridge = await env.bridge()
    await bridge.register(count=1)
    url = f"ws://127.0.0.1:{env.port}/?token={TOKEN}&id=b1"
    async with websockets.connect(url) as ws:
        frames: list[dict[str, Any]] = []

        async def frame() -> dict[str, Any]:
            msg: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
            frames.append(msg)
            return msg

        for task_id in ("s1", "s2"):
            await ws.send(orjson.dumps(generate(task_id)).decode())
            reply = await frame()
            assert reply["code"] == "AssessmentSuccess" and reply["taskId"] == task_id
            assert reply["msg"] == env.service.rt.config.messages.get("AssessmentSuccess")
        assign = await bridge.next()
        await bridge.ack("s1")
        await until(lambda: env.task("s1"), lambda t: t.state == "running")
        assert await refresh(env) == 1  # s2's ETA is known now (a bridge came): news
        assert await task_end(env, assign["data"]["webhookUrl"]) == 200
        kinds = lambda: {"result" if f.get("result") else f["type"] for f in frames}  # noqa: E731
        while not {"result", "QUEUE_UPDATE"} <= kinds():
            await frame()
    result = next(f for f in frames if f.get("result"))
    assert result["taskId"] == "s1" and result["result"]["code"] == 0
    [update] = [f for f in frames if f["type"] == "QUEUE_UPDATE"]
    assert update["taskId"] == "s2" and "result" not in update and "error" not in update


async def test_queue_0_turns_the_updates_off(eta_env: Env) -> None:
    env = eta_env
    quiet = Client(env.port, "b1", TOKEN)
    quiet.url += "&queue=0"
    env.sockets.append((await quiet.connect()).ws)
    await quiet.request(generate("q1"))
    await quiet.request(generate("q2"))
    bridge = await env.bridge()
    await bridge.register(count=1)  # the ETA becomes known: news, for those who want it
    await bridge.next()
    await until(lambda: env.task("q1"), lambda t: t.state == "dispatching")
    assert await refresh(env) == 0  # q2's ETA is known now: news, but not for this client
    with pytest.raises(TimeoutError):
        await quiet.update("q2", timeout=1.0)  # nothing comes: time itself is the subject


async def test_a_process_with_no_bridge_counts_the_slots_another_process_holds(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Two serve processes on one Redis: the bridge on one, the client on the other. The
    client's process sees the busy slot (in flight on ``bridge``, in Redis) and tells its
    client when the task ahead finishes there."""
    async with served(tmp_path, redis, redis_url) as a, served(tmp_path, redis, redis_url) as b:
        bridge = await a.bridge()
        await bridge.register(count=1)
        client = await b.client()
        await client.request(generate("x0"))
        assign = await bridge.next()
        await bridge.ack("x0")
        await until(lambda: b.task("x0"), lambda t: t.state == "running")
        await refresh(b)
        replies = [await client.request(generate(f"x{i}")) for i in (1, 2)]
        assert [r["position"] for r in replies] == [0, 1]
        assert all(r["etaStartMs"] is not None for r in replies), replies
        assert await task_end(b, assign["data"]["webhookUrl"]) == 200  # to b: any process
        await bridge.next()  # x1's TASK_ASSIGN, from a
        await bridge.ack("x1")
        await until(lambda: b.task("x1"), lambda t: t.state == "running")
        update = await update_of(b, client, "x2")
        assert update["position"] == 0 and update["etaStartMs"] < replies[1]["etaStartMs"]


async def test_the_loop_sends_the_updates_by_itself(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with served(tmp_path, redis, redis_url, every_s=0.1) as env:
        client = await env.client()
        await client.request(generate("l0"))
        reply = await client.request(generate("l1"))
        assert reply["etaStartMs"] is None  # no bridge yet
        bridge = await env.bridge()
        await bridge.register(count=1)
        await bridge.next()  # l0 goes; l1 is next, when l0's run is over
        update = await client.update("l1", timeout=30)
        assert update["position"] == 0 and update["etaStartMs"] is not None


async def test_the_estimate_follows_the_policy_in_force(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """A task with priority credit is laid out ahead of its project's older tasks by the
    fair policy, which gives it its place; fifo ignores the credit, and so does its estimate."""
    async with served(tmp_path, redis, redis_url) as env:
        client = await env.client()
        for task_id in ("p0", "p1"):
            await client.request(generate(task_id))
        await client.request({**generate("p2"), "priority": 120})
        await refresh(env)
        positions = [(await task_view(env, t))["position"] for t in ("p0", "p1", "p2")]
        assert positions == [1, 2, 0]


async def test_no_eta_is_told_before_it_has_a_basis(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Issue 37 item 7: on a fresh fleet (no run recorded, no AIGCQ_SHARE_DEFAULT_RUN_S
    set) a start time would be the default's guess (10 s a task, 5-10x off for one-second
    tasks on real ComfyUI): positions only. The first run recorded gives the ETAs their
    basis, and the clients hear it."""
    async with served(tmp_path, redis, redis_url, share_default_run_s=None) as env:
        bridge = await env.bridge()
        await bridge.register(count=1)
        client = await env.client()
        await client.request(generate("f0"))
        assign = await bridge.next()
        await bridge.ack("f0")
        await until(lambda: env.task("f0"), lambda t: t.state == "running")
        await refresh(env)
        reply = await client.request(generate("f1"))
        assert (reply["position"], reply["etaStartMs"]) == (0, None), reply
        assert await task_end(env, assign["data"]["webhookUrl"]) == 200
        await bridge.next()  # f1 runs; f2 waits behind it, timed by f0's run
        await bridge.ack("f1")
        await client.request(generate("f2"))
        update = await update_of(env, client, "f2")
        assert update["position"] == 0 and update["etaStartMs"] is not None
