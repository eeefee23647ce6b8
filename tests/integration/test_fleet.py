"""The whole internal chain in one process: a client, aigcq (real Redis), the real
``aigcq bridge`` agent and ComfyUI emulators, with the RunningHub emulator as paid overflow.

A client's mistake fails its task and leaves the bridge alone; a machine's failure is
retried within max_attempts; a cancel reaches the GPU; an idle GPU is used, not paid for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from aigcq.emulators.comfyui import ComfyUIEmulator
from tests.fakes.fleet import Fleet, fleet, held_prompt_fleet, task_of
from tests.fakes.waiting import until


@pytest.fixture
async def one_gpu(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Fleet]:
    async with fleet(tmp_path, redis, redis_url, [1]) as f:
        yield f


async def test_an_invalid_workflow_fails_its_task_and_leaves_the_bridge_in_rotation(
    one_gpu: Fleet,
) -> None:
    bad = {"1": {"class_type": "EmptyImage", "inputs": {"width": "wide"}}}
    bad["2"] = {"class_type": "SaveImage", "inputs": {"images": ["1", 0]}}
    await one_gpu.client.request(task_of("bad", workflow=bad))
    result = await one_gpu.result("bad")
    assert result["status"] == "failed", result
    error = result["error"]
    assert error["code"] == "PromptValidation" and error["detail"] == {"class": "task"}
    assert "prompt_outputs_failed_validation" in error["message"]
    assert (await one_gpu.task("bad")).attempt == 1  # not retried
    hub = one_gpu.service.hub
    assert hub is not None
    conn = hub.registry.bridges[one_gpu.bridges[0].bridge_id]
    assert conn.quarantined_at is None  # bridge_failure_limit is 1: a count would take it out
    await one_gpu.client.request(task_of("good"))
    assert (await one_gpu.result("good"))["status"] == "success"
    assert (await one_gpu.task("good")).target == "bridge"


async def test_an_unknown_workflow_fails_at_once_with_workflow_not_found(one_gpu: Fleet) -> None:
    await one_gpu.client.request(task_of("lost", workflowId="nope", nodeInfoList=[]))
    result = await one_gpu.result("lost")
    assert result["status"] == "failed"
    assert result["error"]["code"] == "WorkflowNotFound"


async def test_a_prompt_comfyui_forgot_is_retried_and_finishes(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with fleet(tmp_path, redis, redis_url, [1], failure_limit=3) as one_gpu:
        await _forgotten_and_retried(one_gpu)


async def _forgotten_and_retried(one_gpu: Fleet) -> None:
    await one_gpu.client.request(task_of("forgot"))
    await one_gpu.until_task("forgot", lambda t: t.state == "running")
    await until(lambda: _running(one_gpu.comfy[0]), bool)
    await one_gpu.comfy[0].restart()  # faster than any health check
    result = await one_gpu.result("forgot")
    assert result["status"] == "success"
    task = await one_gpu.task("forgot")
    assert (task.attempt, task.target) == (2, "bridge")


async def _running(emulator: ComfyUIEmulator) -> str:
    return emulator.running.prompt_id if emulator.running else ""


async def test_a_cancel_stops_the_prompt_and_the_idle_gpu_takes_the_next_task(
    one_gpu: Fleet,
) -> None:
    await one_gpu.client.request(task_of("stop"))
    await until(lambda: _running(one_gpu.comfy[0]), lambda p: p == "stop", within=10)
    reply = await one_gpu.client.request({"type": "cancel", "taskId": "stop"})
    assert reply["type"] == "cancelled"
    entry = await until(lambda: _history(one_gpu.comfy[0], "stop"), bool, within=10)
    assert entry["status"]["messages"][-1][0] == "execution_interrupted"
    await one_gpu.client.request(task_of("next"))
    assert (await one_gpu.result("next"))["status"] == "success"
    assert (await one_gpu.task("next")).target == "bridge"  # not the paid platform


async def _history(emulator: ComfyUIEmulator, prompt_id: str) -> dict[str, Any]:
    return emulator.history.get(prompt_id) or {}


async def test_an_instance_that_dies_mid_run_is_retried_on_another_bridge(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with fleet(tmp_path, redis, redis_url, [1, 1]) as f:
        await f.client.request(task_of("die"))
        running = await until(lambda: _running_on(f.comfy), lambda i: i is not None, within=10)
        assert running is not None
        f.comfy[running].config.fail_next = 0
        await f.comfy[running].restart()
        f.bridges[running].pool.instances[0].healthy = False  # as its check finds it down
        result = await f.result("die")
        assert result["status"] == "success"
        assert (await f.task("die")).attempt == 2


async def _running_on(emulators: list[ComfyUIEmulator]) -> int | None:
    return next((i for i, e in enumerate(emulators) if e.running), None)


async def test_a_restarted_bridge_readopts_its_prompt_instead_of_running_it_again(
    one_gpu: Fleet,
) -> None:
    await one_gpu.client.request(task_of("keep"))
    await until(lambda: _running(one_gpu.comfy[0]), lambda p: p == "keep", within=10)
    await one_gpu.restart_bridge(0)
    result = await one_gpu.result("keep")
    assert result["status"] == "success"
    task = await one_gpu.task("keep")
    assert (task.attempt, task.target) == (1, "bridge")
    assert list(one_gpu.comfy[0].history) == ["keep"]  # ran once, never as "keep-2"


async def test_a_bridge_stopped_before_comfyui_answered_its_submit_readopts_the_prompt(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """The worst moment for a restart: ComfyUI took the prompt, the bridge has not heard."""
    async with held_prompt_fleet(tmp_path, redis, redis_url, reply=True) as (f, front):
        await f.client.request(task_of("keep"))
        await asyncio.wait_for(front.holding.wait(), 10)
        await f.restart_bridge(0)
        front.release.set()
        result = await f.result("keep")
        assert result["status"] == "success"
        task = await f.task("keep")
        assert (task.attempt, task.target) == (1, "bridge")
        assert list(f.comfy[0].history) == ["keep"]  # ran once, never as "keep-2"


async def test_a_cancel_while_the_prompt_is_on_its_way_stops_it_once_comfyui_queued_it(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    """A TASK_CANCEL between the bridge's POST /prompt and ComfyUI queueing it: the queue had
    nothing to delete yet, and the prompt must not run on the slot the hub gave away."""
    async with held_prompt_fleet(tmp_path, redis, redis_url, reply=False) as (f, front):
        runner = f.bridges[0].runner
        await f.client.request(task_of("late"))
        await asyncio.wait_for(front.holding.wait(), 10)
        reply = await f.client.request({"type": "cancel", "taskId": "late"})
        assert reply["type"] == "cancelled"
        await until(lambda: _cancelled_or_gone(runner.running, "late"), bool, within=10)
        front.release.set()  # ComfyUI queues "late" now
        await f.client.request(task_of("next"))
        assert (await f.result("next"))["status"] == "success"
        late = f.comfy[0].history.get("late")
        # deleted from the queue (no history), or interrupted if it had started; never run
        assert late is None or late["status"]["messages"][-1][0] == "execution_interrupted", late
        assert list(f.comfy[0].history)[-1] == "next"


async def _cancelled_or_gone(running: dict[str, Any], task_id: str) -> bool:
    task = running.get(task_id)
    return task is None or bool(task.cancelled)
