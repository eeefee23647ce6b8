"""Issue 29 item 5: cancel and replay tasks by filter (admin API), a replay never paying a
platform twice. A real serve process, the recording RunningHub and Coze emulators, a fake
bridge on the hub's socket."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from aigcq.domain import TaskState
from aigcq.emulators.coze import CozeEmulatorConfig
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from tests.fakes.bridge import BRIDGE_TOKEN, Bridge, task_end
from tests.fakes.client import Client, generate
from tests.fakes.paid import COZE_KEY, RH_KEY, TOKEN, Paid, models, paid_stack
from tests.fakes.waiting import until

ADMIN = "by-filter-admin-token"
HEADERS = {"Authorization": f"Bearer {ADMIN}"}
SUCCESS = {"code": 0, "msg": "success", "data": [{"fileUrl": "http://x/1.png", "nodeId": "9"}]}
FAILURE = {"code": 1, "msg": "bad node", "failure": {"class": "task", "code": "PromptValidation",
           "message": "bad node"}}  # fmt: skip


async def control(env: Paid, action: str, **body: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=env.base, headers=HEADERS) as http:
        r = await http.post(f"/api/admin/tasks/{action}", json=body)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


async def state_of(env: Paid, task_id: str) -> TaskState:
    return (await env.task(task_id)).state


async def in_state(env: Paid, task_id: str, state: TaskState) -> None:
    await until(partial(state_of, env, task_id), lambda s: s is state, within=15)


async def test_cancel_by_filter_takes_only_what_it_names(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """proj's running and waiting tasks are cancelled (RunningHub told to stop the running
    ones); another project's and another client's are left alone; a dry run changes
    nothing."""
    rh = RunningHubEmulatorConfig(duration_s=60, max_concurrent=10)
    model = models(concurrency=2) | {"other": {"comfyui": {"apikey": "o-key", "concurrency": 2}}}
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, model=model, admin_token=ADMIN) as env:
        other_client = await Client(int(env.base.rsplit(":", 1)[1]), "b2", TOKEN).connect()
        try:
            for task_id in ("c1", "c2", "c3"):
                await env.client.request(generate(task_id))  # two run, one waits (cap 2)
            await env.client.request(generate("x1", aigc="other"))
            for task_id in ("c1", "c2", "x1"):
                await in_state(env, task_id, TaskState.RUNNING)
            since = time.time()
            await other_client.request(generate("b2-task", aigc="other"))
            await in_state(env, "b2-task", TaskState.RUNNING)

            dry = await control(env, "cancel", project="proj", dryRun=True)
            assert (dry["matched"], sorted(dry["tasks"]), dry["cancelled"]) == (
                3, ["c1", "c2", "c3"], []
            )  # fmt: skip
            assert await state_of(env, "c3") is TaskState.PENDING
            waiting = await control(env, "cancel", project="proj", state="pending")
            assert waiting["cancelled"] == ["c3"] and waiting["skipped"] == []
            mine = await control(env, "cancel", client="b2", since=since)
            assert mine["cancelled"] == ["b2-task"]
            rest = await control(env, "cancel", project="proj", limit=1)
            assert rest["matched"] == 2 and rest["more"] is True and len(rest["cancelled"]) == 1
            rest = await control(env, "cancel", project="proj")
            assert rest["matched"] == 1 and rest["more"] is False
            for task_id in ("c1", "c2", "c3", "b2-task"):
                assert await state_of(env, task_id) is TaskState.CANCELLED
            assert await state_of(env, "x1") is TaskState.RUNNING

            async def cancelled_remotely() -> int:
                return len((await env.records())[RH_KEY]["cancels"])

            await until(cancelled_remotely, lambda n: n == 2)
        finally:
            await other_client.close()


async def test_replay_by_filter_queues_failed_tasks_again(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Two tasks failed on a bridge (the task's own fault), one of another client's
    ended otherwise; the replay of ``client=b1`` runs exactly b1's failed ones again."""
    model = {"proj": {"comfyui": {"apikey": RH_KEY, "concurrency": 0}}}
    options = {"admin_token": ADMIN, "bridge_token": BRIDGE_TOKEN}
    async with paid_stack(tmp_path, redis, redis_url, model=model, **options) as env:
        bridge = await Bridge.connect(int(env.base.rsplit(":", 1)[1]))
        try:
            await bridge.register(count=2)
            for task_id in ("f1", "f2"):
                await env.client.request(generate(task_id))
            for _ in range(2):
                assign = (await bridge.next())["data"]
                await bridge.ack(assign["taskId"])
                failure = FAILURE["failure"]
                assert await task_end(env, assign["webhookUrl"], failure=failure) == 200
            for task_id in ("f1", "f2"):
                await in_state(env, task_id, TaskState.FAILED)
            nothing = await control(env, "replay", client="nobody")
            assert nothing["matched"] == 0
            replay = await control(env, "replay", client="b1", platform="comfyui")
            assert sorted(replay["queued"]) == ["f1", "f2"] and replay["delivered"] == []
            again = {(await bridge.next())["data"]["taskId"] for _ in range(2)}
            assert again == {"f1", "f2"}
            assert await control(env, "replay", client="b1") == {
                "matched": 0, "tasks": [], "more": False, "dryRun": False,
                "queued": [], "delivered": [], "skipped": [],
            }  # fmt: skip
        finally:
            await bridge.ws.close()


async def test_a_replay_delivers_a_paid_result_that_came_late_and_never_creates_again(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """An operator cancelled a task running on RunningHub; RunningHub, slow to stop it,
    finished it and sent its success. While that run may still be out a replay leaves the
    task alone; once its result came, the replay delivers that result: one create."""
    rh = RunningHubEmulatorConfig(duration_s=60, max_concurrent=5)
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, admin_token=ADMIN) as env:
        await env.faults(cancel_delay_s=60)  # RunningHub says "cancelled", runs on
        await env.cancel_running("late")
        held = await control(env, "replay", state="cancelled", project="proj")
        [skipped] = held["skipped"]
        assert (
            skipped["taskId"] == "late" and "a paid run of it may still be out" in skipped["reason"]
        )
        assert await state_of(env, "late") is TaskState.CANCELLED

        assert await env.post_task_end("late", 1, SUCCESS) == 410  # the task had ended
        replay = await control(env, "replay", state="cancelled", project="proj")
        assert replay["delivered"] == ["late"] and replay["queued"] == []
        task = await env.task("late")
        assert task.state is TaskState.SUCCESS and task.result == SUCCESS
        results = await until(lambda: _results(env, "late"), lambda r: len(r) == 2)
        assert [r["status"] for r in results] == ["cancelled", "success"]
        assert results[1]["result"] == SUCCESS
        assert len(await env.creates("late")) == 1
        retry = await control(env, "replay", state="cancelled,failed", project="proj")
        assert retry["matched"] == 0  # a success is not replayed


async def test_a_coze_run_finishing_after_its_cancel_is_delivered_by_the_replay(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Coze cannot cancel: the run finishes; the orphan check that sees its success keeps
    it, and the single-task retry (the dashboard's Retry) delivers it: one create."""
    cz = CozeEmulatorConfig(duration_s=1.0)
    async with paid_stack(tmp_path, redis, redis_url, cz=cz, admin_token=ADMIN) as env:
        task = generate("cz", platform="coze", workflow_id="wf1", parameters={"q": "cz"})
        await env.client.request(task)
        await until(partial(env.task, "cz"), lambda t: t.state is TaskState.RUNNING)
        await env.service.gateway.cancel("cz", None)
        async with httpx.AsyncClient(base_url=env.base, headers=HEADERS) as http:
            early = await http.post("/api/admin/tasks/cz/retry")
            assert early.status_code == 409 and "may still be out" in early.json()["detail"]
            keys = env.service.rt.store.keys
            await until(partial(redis.zcard, keys.orphans("proj", "coze")), lambda n: n == 0)
            r = await http.post("/api/admin/tasks/cz/retry")
        assert r.json() == {"taskId": "cz", "state": "success"}
        assert (await env.task("cz")).state is TaskState.SUCCESS
        assert len((await env.records("coze"))[COZE_KEY]["creates"]) == 1


async def _results(env: Paid, task_id: str) -> list[dict[str, Any]]:
    await env.client.linger(0.05)
    return env.client.results.get(task_id, [])


@pytest.mark.parametrize(
    ("action", "body", "says"),
    [
        ("cancel", {}, "name at least one filter"),
        ("cancel", {"state": "success"}, "state 'success': this acts on dispatching, pending"),
        ("replay", {"state": "running"}, "this acts on cancelled, failed"),
        ("cancel", {"project": "nope"}, "no project 'nope' (known: proj)"),
        ("cancel", {"platform": "midjourney"}, "no platform 'midjourney'"),
        ("replay", {"target": "gpu"}, "no target 'gpu' (known: bridge, coze, jimuai"),
        ("cancel", {"project": "proj", "status": "x"}, "status: Extra inputs"),
        ("cancel", {"project": "proj", "limit": 0}, "limit"),
        ("replay", {"since": "yesterday"}, "since"),
    ],
)
async def test_a_bad_filter_is_refused_with_control_error_and_changes_nothing(
    tmp_path: Path,
    redis: aioredis.Redis,
    redis_url: str,
    action: str,
    body: dict[str, Any],
    says: str,
) -> None:
    model = models(concurrency=0)
    async with paid_stack(tmp_path, redis, redis_url, model=model, admin_token=ADMIN) as env:
        await env.client.request(generate("stays"))
        async with httpx.AsyncClient(base_url=env.base, headers=HEADERS) as http:
            r = await http.post(f"/api/admin/tasks/{action}", json=body)
            assert r.status_code == 400, r.text
            assert r.json()["code"] == "ControlError" and says in r.json()["detail"], r.json()
            anonymous = await httpx.AsyncClient(base_url=env.base).post(
                f"/api/admin/tasks/{action}", json={"project": "proj"}
            )
            assert anonymous.status_code == 401
        assert await state_of(env, "stays") is TaskState.PENDING
