"""Issue 29 item 5: an operator pauses a project, a paid account, a workflow or a bridge.
Its waiting tasks hold (not dispatched there, not failed) on every serve process, and run
once it is resumed. Real serve processes on one Redis, the recording RunningHub emulator,
fake bridges on the hub's socket."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from aigcq.domain import TaskState
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from tests.fakes.bridge import BRIDGE_TOKEN, Bridge, instances_with
from tests.fakes.client import generate
from tests.fakes.comfyui import model_graph
from tests.fakes.paid import RH_KEY, Paid, paid_stack, serve_beside
from tests.fakes.waiting import until

ADMIN = "incident-admin-token"
HEADERS = {"Authorization": f"Bearer {ADMIN}"}
OTHER_KEY = "rh-key-other"


def accounts(**keys: str) -> dict[str, Any]:
    """model.json: each project on RunningHub (comfyui) with its key."""
    return {p: {"comfyui": {"apikey": k, "concurrency": 5}} for p, k in keys.items()}


async def control(env: Paid, action: str, **body: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=env.base, headers=HEADERS) as http:
        return await http.post(f"/api/admin/{action}", json=body)


async def states(env: Paid, *task_ids: str) -> list[TaskState]:
    return [(await env.task(t)).state for t in task_ids]


async def creates_by_key(env: Paid) -> dict[str, list[str]]:
    """Our task ids RunningHub created, per API key."""
    return {key: [c["task"] for c in rec["creates"]] for key, rec in (await env.records()).items()}


async def succeeded(env: Paid, task_id: str) -> None:
    await until(partial(env.task, task_id), lambda t: t.state is TaskState.SUCCESS, within=15)


def quick_rh() -> RunningHubEmulatorConfig:
    return RunningHubEmulatorConfig(duration_s=0.1, max_concurrent=10)


async def test_a_paused_project_holds_on_two_processes_and_runs_when_resumed(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    model = accounts(proj=RH_KEY, other=OTHER_KEY)
    async with (
        paid_stack(tmp_path, redis, redis_url, model=model, rh=quick_rh(), admin_token=ADMIN) as a,
        serve_beside(a, tmp_path) as b,
    ):
        r = await control(a, "pause", kind="project", name="proj", note="incident 42")
        assert r.status_code == 200, r.text
        assert r.json() == {"kind": "project", "name": "proj", "paused": True, "changed": True}
        await a.client.request(generate("p-a"))
        await b.client.request(generate("p-b"))
        # the other project's tasks, submitted after, run on both: their rounds held proj's
        await a.client.request(generate("o-a", aigc="other"))
        await b.client.request(generate("o-b", aigc="other"))
        await succeeded(a, "o-a")
        await succeeded(a, "o-b")
        assert await states(a, "p-a", "p-b") == [TaskState.PENDING] * 2
        assert sorted((await creates_by_key(a))[OTHER_KEY]) == ["o-a", "o-b"]
        assert RH_KEY not in await creates_by_key(a)
        async with httpx.AsyncClient(base_url=b.base, headers=HEADERS) as http:
            [shown] = (await http.get("/api/admin/pauses")).json()["pauses"]
        assert (shown["kind"], shown["name"], shown["note"]) == ("project", "proj", "incident 42")

        r = await control(b, "resume", kind="project", name="proj")
        assert r.json()["changed"] is True
        await succeeded(a, "p-a")
        await succeeded(a, "p-b")
        assert sorted((await creates_by_key(a))[RH_KEY]) == ["p-a", "p-b"]  # once each
        again = await control(b, "resume", kind="project", name="proj")
        assert again.status_code == 200 and again.json()["changed"] is False


async def test_a_paused_account_makes_no_create_while_a_bridge_or_another_account_runs(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """``proj/comfyui`` pauses proj's RunningHub account, and ``shared``'s, which has the
    same key. proj's tasks wait for the bridge's one slot; ``other``'s key still creates."""
    model = accounts(proj=RH_KEY, shared=RH_KEY, other=OTHER_KEY)
    options = {"admin_token": ADMIN, "bridge_token": BRIDGE_TOKEN}
    async with paid_stack(tmp_path, redis, redis_url, model=model, rh=quick_rh(), **options) as env:
        r = await control(env, "pause", kind="account", name="proj/comfyui")
        assert r.json()["name"] == "proj/runninghub"
        bridge = await Bridge.connect(int(env.base.rsplit(":", 1)[1]))
        try:
            await bridge.register(count=1)
            for task_id in ("a1", "a2", "a3"):
                await env.client.request(generate(task_id))
            assign = await bridge.next()
            assert assign["data"]["taskId"] == "a1"
            await bridge.ack("a1")
            await env.client.request(generate("s1", aigc="shared"))
            await env.client.request(generate("o1", aigc="other"))  # the bridge is busy
            await succeeded(env, "o1")
            assert await states(env, "a2", "a3", "s1") == [TaskState.PENDING] * 3
            assert await creates_by_key(env) == {OTHER_KEY: ["o1"]}

            await control(env, "resume", kind="account", name="proj/runninghub")
            for task_id in ("a2", "a3", "s1"):
                await succeeded(env, task_id)
            assert sorted((await creates_by_key(env))[RH_KEY]) == ["a2", "a3", "s1"]
            assert (await env.task("a1")).state is TaskState.RUNNING  # the bridge's, still
        finally:
            await bridge.ws.close()


async def test_a_task_the_bridges_hand_back_waits_while_its_account_is_paused(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """No connected instance has the model the task needs: with its account paused the
    hub leaves it waiting unclaimed (neither created, nor charged an attempt, nor failed
    ``NoCapableInstance``), and the task behind it runs on the bridge."""
    options = {"admin_token": ADMIN, "bridge_token": BRIDGE_TOKEN}
    async with paid_stack(tmp_path, redis, redis_url, rh=quick_rh(), **options) as env:
        await control(env, "pause", kind="account", name="runninghub")
        bridge = await Bridge.connect(int(env.base.rsplit(":", 1)[1]))
        try:
            await bridge.register(count=1, instances=instances_with("a.safetensors"))
            await env.client.request(generate("needs-c", workflow=model_graph("c.safetensors")))
            await env.client.request(generate("plain"))
            assert (await bridge.next())["data"]["taskId"] == "plain"  # after needs-c's turn
            left = await env.task("needs-c")  # weighed in that round: it keeps its place
            assert (left.state, left.attempt, left.error) == (TaskState.PENDING, 0, None)
            assert await creates_by_key(env) == {}
            await control(env, "resume", kind="account", name="runninghub")
            await succeeded(env, "needs-c")
            assert (await creates_by_key(env))[RH_KEY] == ["needs-c"]
        finally:
            await bridge.ws.close()


async def test_a_paused_workflow_is_passed_over_and_runs_when_resumed(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with paid_stack(tmp_path, redis, redis_url, rh=quick_rh(), admin_token=ADMIN) as env:
        await control(env, "pause", kind="workflow", name="wf-broken")
        for task_id, workflow in (("w1", "wf-broken"), ("w2", "wf-ok"), ("w3", "wf-broken")):
            await env.client.request(generate(task_id, workflowId=workflow, nodeInfoList=[]))
        await succeeded(env, "w2")  # behind a paused one, in the same queue
        assert await states(env, "w1", "w3") == [TaskState.PENDING] * 2
        assert (await creates_by_key(env))[RH_KEY] == ["w2"]
        await control(env, "resume", kind="workflow", name="wf-broken")
        await succeeded(env, "w1")
        await succeeded(env, "w3")
        created = (await creates_by_key(env))[RH_KEY]
        assert created[0] == "w2" and sorted(created) == ["w1", "w2", "w3"]  # once each


async def test_the_bridges_lookahead_passes_over_a_paused_workflow(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Bridges that describe their instances choose what to claim from the head (the
    lookahead): a paused workflow's task at the head is passed over there too."""
    model = {"proj": {"comfyui": {"apikey": RH_KEY, "concurrency": 0}}}  # no paid room
    options = {"admin_token": ADMIN, "bridge_token": BRIDGE_TOKEN}
    async with paid_stack(tmp_path, redis, redis_url, model=model, **options) as env:
        await control(env, "pause", kind="workflow", name="wf-broken")
        bridge = await Bridge.connect(int(env.base.rsplit(":", 1)[1]))
        try:
            await bridge.register(count=1, instances=instances_with("a.safetensors"))
            graph = model_graph("a.safetensors")
            await env.client.request(generate("w1", workflow=graph, workflowId="wf-broken"))
            await env.client.request(generate("w2", workflow=graph, workflowId="wf-ok"))
            assert (await bridge.next())["data"]["taskId"] == "w2"
            held = await env.task("w1")
            assert (held.state, held.attempt) == (TaskState.PENDING, 0)
        finally:
            await bridge.ws.close()


async def test_a_bridge_drained_on_one_process_takes_nothing_on_the_other(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """br1 is connected to process a; process b drains it (an operator's API call landed
    there). a's next tasks go to br2 instead; undrained on b, br1 is assigned again."""
    model = {"proj": {"comfyui": {"apikey": RH_KEY, "concurrency": 0}}}  # no paid room
    options = {"admin_token": ADMIN, "bridge_token": BRIDGE_TOKEN}
    async with (
        paid_stack(tmp_path, redis, redis_url, model=model, **options) as a,
        serve_beside(a, tmp_path) as b,
    ):
        port = int(a.base.rsplit(":", 1)[1])
        br1, br2 = await Bridge.connect(port), await Bridge.connect(port)
        try:
            await br1.register("br1", count=1)
            known = partial(a.service.rt.redis.exists, a.service.rt.store.keys.bridge("br1"))
            await until(known, bool)  # its REGISTER reached a and Redis
            async with httpx.AsyncClient(base_url=b.base, headers=HEADERS) as http:
                r = await http.post("/api/admin/bridges/br1/drain")
                # not connected to b, but known there: it connected to a
                assert r.json() == {
                    "bridgeId": "br1", "drained": True, "connected": False, "known": True
                }  # fmt: skip
                hub = a.service.hub
                assert hub is not None
                await until(partial(_drained, a), lambda d: d == {"br1"})
                await br2.register("br2", count=2)
                await a.client.request(generate("d1"))
                await a.client.request(generate("d2"))
                got = {(await br2.next())["data"]["taskId"] for _ in range(2)}
                assert got == {"d1", "d2"}
                for task_id in got:
                    await br2.ack(task_id)
                assert hub.registry.bridges["br1"].drained
                await http.post("/api/admin/bridges/br1/undrain")
            await a.client.request(generate("d3"))
            assert (await br1.next())["data"]["taskId"] == "d3"
        finally:
            await br1.ws.close()
            await br2.ws.close()


async def _drained(env: Paid) -> set[str]:
    assert env.service.hub is not None
    return set(env.service.hub.registry.drained)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"kind": "queue", "name": "proj"}, "kind"),
        ({"kind": "project", "name": "nope"}, "no project 'nope' in model.json (projects: proj)"),
        ({"kind": "account", "name": "coze"}, "no paid account 'coze'"),
        ({"kind": "account", "name": "proj/jimuai"}, "accounts: proj/runninghub, runninghub"),
        ({"kind": "workflow", "name": " "}, "1 to 200 characters"),
        ({"kind": "bridge"}, "name"),
        ({"kind": "bridge", "name": "br1", "force": True}, "force"),
    ],
)
async def test_a_bad_pause_is_refused_with_control_error_and_changes_nothing(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, body: dict[str, Any], says: str
) -> None:
    model = accounts(proj=RH_KEY)
    async with paid_stack(tmp_path, redis, redis_url, model=model, admin_token=ADMIN) as env:
        for action in ("pause", "resume"):
            r = await control(env, action, **body)
            assert r.status_code == 400, r.text
            assert r.json()["code"] == "ControlError" and says in r.json()["detail"], r.json()
            assert r.json()["msg"] == "管理操作无效，请检查参数。"
        assert await redis.hgetall(env.service.rt.store.keys.pauses) == {}
        unauthorized = await httpx.AsyncClient(base_url=env.base).post(
            "/api/admin/pause", json={"kind": "project", "name": "proj"}
        )
        assert unauthorized.status_code == 401
