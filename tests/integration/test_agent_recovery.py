"""The reference bridge acts at once on what it learns (issue 24 items 4, 5 and 8a): an
instance killed mid-prompt, a prompt that finished while the bridge was down, a hub that
assigns a task the bridge already holds.

``ws_silence`` is an hour in these tests: an end that came only after ComfyUI's WebSocket
had been silent that long would not come at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from aigcq.agent.app import Bridge
from aigcq.emulators.comfyui import ComfyUIConfig, ComfyUIEmulator, create_app
from tests.fakes.agent import same_port
from tests.fakes.agent_hub import Env, env
from tests.fakes.comfyui import kill
from tests.fakes.servers import Served, serve_killable
from tests.fakes.waiting import until, wait_until

__all__ = ["env"]  # a fixture: imported for pytest to find

HOUR = 3600.0


@contextlib.asynccontextmanager
async def comfy_fleet(
    tmp_path: Path, count: int
) -> AsyncIterator[list[tuple[Served, ComfyUIEmulator]]]:
    """``count`` ComfyUI emulators that can be killed; each prompt runs about 3 s."""
    async with contextlib.AsyncExitStack() as stack:
        pairs = []
        for i in range(count):
            config = ComfyUIConfig(
                output_dir=tmp_path / f"k{i}" / "output", step_time=0.1, steps=10
            )
            app = create_app(config)
            pairs.append((await stack.enter_async_context(serve_killable(app)), app.state.emulator))
        yield pairs


async def _running(emulator: ComfyUIEmulator) -> str:
    return emulator.running.prompt_id if emulator.running else ""


async def test_a_prompt_whose_instance_is_killed_ends_at_once_as_instance_lost(
    env: Env, tmp_path: Path
) -> None:
    async with comfy_fleet(tmp_path, 1) as [(served, emulator)]:
        settings = env.settings.model_copy(update={"comfyui": [served.url], "ws_silence": HOUR})
        async with Bridge(settings):
            await env.hub.next("REGISTER")
            await env.hub.send("TASK_ASSIGN", env.assign("lost"))
            assert (await env.hub.next("TASK_ACK"))["code"] == 0
            await until(lambda: _running(emulator), lambda p: p == "lost")
            await kill(served, emulator)
            result = await env.end_for("lost")
            assert result["code"] == 1
            assert (result["failure"]["class"], result["failure"]["code"]) == (
                "infrastructure",
                "InstanceLost",
            )


async def test_a_prompt_whose_instance_is_killed_moves_at_once_to_a_free_one(
    env: Env, tmp_path: Path
) -> None:
    async with comfy_fleet(tmp_path, 2) as pairs:
        settings = env.settings.model_copy(
            update={"comfyui": [s.url for s, _ in pairs], "ws_silence": HOUR}
        )
        async with Bridge(settings):
            await env.hub.next("REGISTER")
            await env.hub.send("TASK_ASSIGN", env.assign("moved"))
            emulators = [e for _, e in pairs]
            victim = await until(
                lambda: _running_index(emulators), lambda i: i is not None, within=10
            )
            assert victim is not None
            await kill(*pairs[victim])
            assert (await env.end_for("moved"))["code"] == 0
            assert "moved" in emulators[1 - victim].history


async def _running_index(emulators: list[ComfyUIEmulator]) -> int | None:
    return next((i for i, e in enumerate(emulators) if e.running), None)


async def test_a_prompt_that_finished_while_the_bridge_was_down_is_reported_on_start(
    env: Env, tmp_path: Path
) -> None:
    async with comfy_fleet(tmp_path, 1) as [(served, emulator)]:
        settings = env.settings.model_copy(update={"comfyui": [served.url], "ws_silence": HOUR})
        async with Bridge(settings) as first:
            await env.hub.next("REGISTER")
            await env.hub.send("TASK_ASSIGN", env.assign("done-meanwhile"))
            await until(lambda: _running(emulator), lambda p: p == "done-meanwhile")
        assert env.webhook.received == []  # stopped mid-prompt: no TASK_END
        await wait_until(lambda: "done-meanwhile" in emulator.history, 15)
        async with Bridge(same_port(settings, first)):
            assert (await env.hub.next("REGISTER"))["tasks"] == ["done-meanwhile"]
            assert (await env.end_for("done-meanwhile"))["code"] == 0
