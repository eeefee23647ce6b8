"""A slot is offered again only when its instance is free on the bridge's side (issue 24,
item 2): after a cancel, ComfyUI takes about a second to stop the prompt; the next task
must not be sent (and refused) before then, nor wait for a HEARTBEAT after."""

from __future__ import annotations

import time
from pathlib import Path

import redis.asyncio as aioredis
from starlette.types import ASGIApp

from aigcq.emulators.comfyui import ComfyUIEmulator
from tests.fakes.fleet import fleet, task_of
from tests.fakes.waiting import until

INTERRUPT_LATENCY_S = 1.0


def slow_to_stop(app: ASGIApp) -> ASGIApp:
    """A ComfyUI that, like the real one, goes on for a second after ``/interrupt``."""
    config = app.state.emulator.config  # type: ignore[attr-defined]
    config.interrupt_latency = INTERRUPT_LATENCY_S
    config.steps = 40  # 4 s a node: "stop" is still running when it is cancelled
    return app


async def _running(emulator: ComfyUIEmulator) -> str:
    return emulator.running.prompt_id if emulator.running else ""


async def test_after_a_cancel_the_next_task_is_sent_once_the_instance_is_free(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with fleet(tmp_path, redis, redis_url, [1], comfy_front=slow_to_stop) as f:
        emulator = f.comfy[0]
        # RunningHub has room (overflow_after_ms 0, the seed's): "next" must still wait
        # for the GPU that is stopping, not be paid for
        await f.client.request(task_of("stop"))
        await until(lambda: _running(emulator), lambda p: p == "stop", within=10)
        cancelled_at = time.monotonic()
        reply = await f.client.request({"type": "cancel", "taskId": "stop"})
        assert reply["type"] == "cancelled"
        await f.client.request(task_of("next"))  # while ComfyUI is still stopping "stop"
        await until(lambda: _running(emulator), lambda p: p == "next", within=10)
        took = time.monotonic() - cancelled_at
        stopped = [
            m[1]["timestamp"]
            for m in emulator.history["stop"]["status"]["messages"]
            if m[0] == "execution_interrupted"
        ]
        assert stopped, emulator.history["stop"]["status"]
        assert emulator.running is not None
        # sent to ComfyUI only once the cancelled prompt had stopped there
        assert emulator.running.extra_data["create_time"] >= stopped[0]
        task = await f.task("next")
        assert task.target == "bridge"
        assert task.attempt == 1, "the next task was refused (421) at least once"
        assert took < INTERRUPT_LATENCY_S + 1.0, f"cancel -> next running took {took:.2f}s"
        print(f"cancel -> next task running: {took:.3f}s")
