"""Mixed capabilities do not stall the queue (issue 24, item 3).

One bridge in front of two ComfyUI emulators: instance 0 has every node class, instance 1
lacks ``ImageInvert`` (it runs only the "basic" workflow). The hub places a task only on an
instance that is free *and* can run it, and a task no free instance can run does not hold
back the tasks behind it that one can; an offline instance's capabilities are withdrawn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from aigcq.domain import TaskState
from aigcq.emulators.comfyui import ComfyUIEmulator
from tests.fakes.fleet import Fleet, fleet, task_of
from tests.fakes.waiting import until

#: what instance 1 has: enough for the basic workflow (no ``ImageInvert``)
BASIC_NODES = frozenset({"EmptyImage", "SaveImage"})
BASIC = {
    "1": {
        "class_type": "EmptyImage",
        "inputs": {"width": 64, "height": 48, "batch_size": 1, "color": 0},
    },
    "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "basic"}},
}


def two_kinds(slow: bool) -> Any:
    """Instance 0: every node class (with ``slow``, a prompt takes minutes there: it stays
    busy however loaded the host is; the tests cancel it); instance 1:
    the basic ones."""

    def config(index: int) -> dict[str, Any]:
        if index == 1:
            return {"node_classes": BASIC_NODES}
        return {"steps": 400} if slow else {}

    return config


def special(task_id: str) -> dict[str, Any]:
    """A task only instance 0 can run (``wf-1`` names ``ImageInvert``)."""
    return task_of(task_id)


def basic(task_id: str) -> dict[str, Any]:
    return task_of(task_id, workflowId="wf-basic", nodeInfoList=[])


async def register_basic(f: Fleet) -> None:
    rt = f.service.rt
    await rt.redis.set(rt.store.keys.workflow("wf-basic"), json.dumps(BASIC))


async def refusals(f: Fleet, task_ids: list[str]) -> list[str]:
    """Every timeline note of ``task_ids`` that says a bridge refused the task."""
    notes = []
    for task_id in task_ids:
        for entry in await f.service.rt.store.reads.timeline(task_id):
            if "refused" in str(entry.get("note", "")):
                notes.append(f"{task_id}: {entry['note']}")
    return notes


def saved(emulator: ComfyUIEmulator, prefix: str) -> int:
    """How many images of ``prefix`` the instance saved (its history may be cleared: the
    bridge deletes the entries it collected)."""
    return len(list(Path(emulator.config.output_dir).glob(f"{prefix}_*.png")))


async def _running(emulator: ComfyUIEmulator) -> str:
    return emulator.running.prompt_id if emulator.running else ""


async def results(f: Fleet, task_ids: set[str]) -> dict[str, dict[str, Any]]:
    """The results of ``task_ids``, as they come."""
    got: dict[str, dict[str, Any]] = {}
    while set(got) != task_ids:
        message = await f.client.next(timeout=20.0)
        if message.get("type") == "result" and message.get("taskId") in task_ids:
            got[message["taskId"]] = message
    return got


async def test_basic_tasks_behind_a_task_whose_only_instance_is_busy_run_on_the_idle_one(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Eight basic tasks queued behind a task that only the busy instance 0 can run go to
    the idle instance 1 at once; the special task is never sent to be refused (421), and
    it runs on instance 0 once that is free."""
    async with fleet(tmp_path, redis, redis_url, [2], paid=0, comfy=two_kinds(slow=True)) as f:
        await register_basic(f)
        capable = f.comfy[0]
        await f.client.request(special("long"))
        await until(lambda: _running(capable), lambda p: p == "long", within=10)
        await f.client.request(special("special"))
        basics = [f"b{i}" for i in range(8)]
        for task_id in basics:
            await f.client.request(basic(task_id))
        done = await results(f, set(basics))
        assert {t: r["status"] for t, r in done.items()} == dict.fromkeys(basics, "success")
        assert await _running(capable) == "long", "the basic tasks ran while it was busy"
        assert (saved(f.comfy[1], "basic"), saved(capable, "basic")) == (len(basics), 0)
        waiting = await f.task("special")
        assert waiting.state == TaskState.PENDING
        assert waiting.attempt == 0, "claimed while no free instance could run it"
        assert await refusals(f, ["long", "special", *basics]) == []
        # its instance free again, the special task runs there (quickly now)
        capable.config.steps = 3
        assert (await f.client.request({"type": "cancel", "taskId": "long"}))["type"] == (
            "cancelled"
        )
        ran = await results(f, {"special"})
        assert ran["special"]["status"] == "success"
        assert "special" in capable.history
        assert await refusals(f, ["special"]) == []


async def test_another_projects_task_takes_the_slot_a_queue_could_not_use(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Two AIGC projects share the bridge: the free slot counted for the one whose waiting
    task only the busy instance can run goes to the other's basic task in the same round,
    not at the next sweep (a minute away here)."""
    async with fleet(
        tmp_path,
        redis,
        redis_url,
        [2],
        paid=0,
        comfy=two_kinds(slow=True),
        projects=("proj", "other"),
        sweep_interval_s=60.0,
    ) as f:
        await register_basic(f)
        await f.client.request(special("long"))
        await until(lambda: _running(f.comfy[0]), lambda p: p == "long", within=10)
        await f.client.request(special("special"))
        for i in range(3):  # each round's share may go to either project first
            task_id = f"other-{i}"
            await f.client.request(basic(task_id) | {"AIGC": "other"})
            assert (await results(f, {task_id}))[task_id]["status"] == "success"
        assert (await f.task("special")).attempt == 0
        f.comfy[0].config.steps = 3


async def test_a_task_only_an_offline_instance_could_run_fails_after_the_wait(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Instance 0 is offline and no paid platform serves the queue: the basic task behind
    the special one runs on instance 1; the special one is not sent to the bridge (no
    assign → 421 loop) and fails ``NoCapableInstance`` after ``no_capable_wait_s``."""
    async with fleet(
        tmp_path,
        redis,
        redis_url,
        [2],
        paid=0,
        comfy=two_kinds(slow=False),
        no_capable_wait_s=1.0,
    ) as f:
        await register_basic(f)
        await offline(f, 0)
        await f.client.request(special("special"))
        await f.client.request(basic("basic"))
        done = await results(f, {"special", "basic"})
        assert done["basic"]["status"] == "success"
        failed = done["special"]
        assert failed["status"] == "failed"
        assert failed["error"]["code"] == "NoCapableInstance"
        assert "ImageInvert" in failed["error"]["detail"]
        assert failed["error"]["message"] == f.service.rt.config.messages.get("NoCapableInstance")
        assert failed["error"]["message"] != "NoCapableInstance"  # a default text
        assert (await f.task("special")).attempt == 1, "claimed more than once"
        assert await refusals(f, ["special", "basic"]) == []


async def test_a_task_only_an_offline_instance_could_run_goes_to_the_paid_platform(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """As above with RunningHub serving the queue: the special task overflows there (the
    existing overflow path), the basic one runs on instance 1, nothing is refused."""
    async with fleet(tmp_path, redis, redis_url, [2], comfy=two_kinds(slow=False)) as f:
        await register_basic(f)
        await offline(f, 0)
        await f.client.request(special("special"))
        await f.client.request(basic("basic"))
        sent = await f.until_task("special", lambda t: t.state == TaskState.RUNNING)
        assert sent.target == "runninghub"
        done = await results(f, {"basic"})
        assert done["basic"]["status"] == "success"
        assert (await f.task("basic")).target == "bridge"
        assert await refusals(f, ["special", "basic"]) == []


async def offline(f: Fleet, index: int) -> None:
    """Kill emulator ``index``; until the hub has the bridge's report of it offline."""
    await f.kill_comfy(index)
    hub = f.service.hub
    assert hub is not None

    async def states() -> list[str]:
        return [i["state"] for c in hub.registry.live() for i in c.instance_states]

    await until(states, lambda s: s.count("offline") == 1, within=10)


async def test_a_basic_task_behind_many_users_special_tasks_runs_on_the_idle_one(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """Issue 37 with capabilities: six end users' tasks that only the busy instance 0 can
    run come first in fair order, so the users a round reads for its one free place hold
    none the idle instance 1 can run; the round reads on (every ready key) and the basic
    task behind them runs there at once."""
    async with fleet(tmp_path, redis, redis_url, [2], paid=0, comfy=two_kinds(slow=True)) as f:
        await register_basic(f)
        capable = f.comfy[0]
        await f.client.request(special("long"))
        await until(lambda: _running(capable), lambda p: p == "long", within=10)
        for i in range(6):
            await f.client.request(special(f"special-{i}") | {"userId": f"user-{i}"})
        await f.client.request(basic("late-basic") | {"userId": "late"})
        done = await results(f, {"late-basic"})
        assert done["late-basic"]["status"] == "success"
        assert (saved(f.comfy[1], "basic"), saved(capable, "basic")) == (1, 0)
        assert await _running(capable) == "long"
        assert [(await f.task(f"special-{i}")).attempt for i in range(6)] == [0] * 6
