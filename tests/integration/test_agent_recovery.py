"""The reference bridge acts at once on what it learns (issue 24 items 4, 5 and 8a): an
instance killed mid-prompt, a prompt that finished while the bridge was down, a hub that
assigns a task the bridge already holds.

``ws_silence`` is an hour in these tests: an end that came only after ComfyUI's WebSocket
had been silent that long would not come at all.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from aigcq.agent.app import Bridge
from aigcq.emulators.comfyui import ComfyUIConfig, ComfyUIEmulator, create_app
from tests.fakes.agent import same_port
from tests.fakes.agent_hub import Env, Hub, env
from tests.fakes.comfyui import GRAPH, invert_graph, kill
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
            result = await env.end_for("done-meanwhile")
            assert result["code"] == 0
        # from its submission (its prompt ran 3 s), not from its re-adoption (it said 0)
        assert result["data"][0]["taskCostTime"] >= 1


def _second(env: Env, task_id: str) -> dict[str, object]:
    """``task_id``'s TASK_ASSIGN as the hub sends it again: attempt 2, its own webhook."""
    return env.assign(
        task_id, attempt=2, webhookUrl=f"{env.webhook_url}/callback/{task_id}?sig=two"
    )


async def _ends_at(env: Env, task_id: str, query: str) -> list[dict[str, object]]:
    """The eventData of every TASK_END for ``task_id`` POSTed to the webhook with ``query``."""
    await wait_until(
        lambda: any(r.query == query for r in env.webhook.received), 10, what=f"TASK_END {query}"
    )
    return [
        json.loads(r.json()["eventData"])
        for r in env.webhook.received
        if r.path == f"/callback/{task_id}" and r.query == query
    ]


async def test_a_newer_attempt_of_a_running_task_adopts_its_prompt(
    env: Env, tmp_path: Path
) -> None:
    """Issue 24 item 8a: acknowledged, the newer attempt is the one the TASK_END carries
    (the older one's would be fenced), and the prompt runs once."""
    async with comfy_fleet(tmp_path, 1) as [(served, emulator)]:
        settings = env.settings.model_copy(update={"comfyui": [served.url]})
        async with Bridge(settings):
            await env.hub.next("REGISTER")
            await env.hub.send("TASK_ASSIGN", env.assign("again"))
            assert (await env.hub.next("TASK_ACK"))["data"]["attempt"] == 1
            await until(lambda: _running(emulator), lambda p: p == "again")
            await env.hub.send("TASK_ASSIGN", _second(env, "again"))
            ack = await env.hub.next("TASK_ACK")
            assert (ack["code"], ack["data"]["attempt"]) == (0, 2)
            [end] = await _ends_at(env, "again", "sig=two")
            assert end["code"] == 0
            assert [r.query for r in env.webhook.received] == ["sig=two"]
            assert list(emulator.history) == ["again"]  # ran once


async def test_a_newer_attempt_of_a_finished_task_takes_its_undelivered_result(
    env: Env,
) -> None:
    env.webhook.fail_first = 10**6  # the older attempt's TASK_END is not taken
    async with Bridge(env.settings):
        await env.hub.next("REGISTER")
        await env.hub.send("TASK_ASSIGN", env.assign("spooled"))
        await env.webhook.wait_for(1, within=10)
        await env.hub.send("TASK_ASSIGN", _second(env, "spooled"))
        assert (await env.hub.next("TASK_ACK"))["data"]["attempt"] == 1
        ack = await env.hub.next("TASK_ACK")
        assert (ack["code"], ack["data"]["attempt"]) == (0, 2)
        # the newer attempt's address is taken from now on; the older one's never (a try
        # of it still out when the bridge readdressed the result would otherwise land)
        env.webhook.refused_queries.add("sig=abc")
        env.webhook.fail_first = len(env.webhook.received)
        [end, *_] = await _ends_at(env, "spooled", "sig=two")
        assert end["code"] == 0
        ran = [e.history for e in env.emulators]
        assert sorted(p for h in ran for p in h) == ["spooled"]  # ran once


async def test_a_newer_attempt_of_a_task_that_failed_on_a_machine_runs_again(env: Env) -> None:
    """The older attempt's machine failure (its prompt lost) is dropped, not handed to the
    newer attempt: that one would only fail without running."""
    env.webhook.fail_first = 10**6
    async with Bridge(env.settings):
        await env.hub.next("REGISTER")
        await env.hub.send("TASK_ASSIGN", env.assign("forgot"))
        running = await until(lambda: _running_index(env.emulators), lambda i: i is not None)
        assert running is not None
        await env.emulators[running].restart()  # forgets the prompt: PromptLost
        [received] = await env.webhook.wait_for(1, within=10)
        assert json.loads(received.json()["eventData"])["failure"]["code"] == "PromptLost"
        env.webhook.fail_first = 0
        await env.hub.send("TASK_ASSIGN", _second(env, "forgot"))
        [end, *_] = await _ends_at(env, "forgot", "sig=two")
        assert end["code"] == 0
        assert any("forgot-2" in e.history for e in env.emulators)


async def test_a_newer_attempt_of_a_task_being_stopped_is_refused(env: Env, tmp_path: Path) -> None:
    """Its instance is still letting the cancelled prompt go: the bridge will not run the
    new attempt, so it does not acknowledge it."""
    async with comfy_fleet(tmp_path, 1) as [(served, emulator)]:
        emulator.config.interrupt_latency = HOUR  # as a GPU that never lets go
        settings = env.settings.model_copy(update={"comfyui": [served.url]})
        async with Bridge(settings) as bridge:
            await env.hub.next("REGISTER")
            await env.hub.send("TASK_ASSIGN", env.assign("stopping"))
            await env.hub.next("TASK_ACK")
            await until(lambda: _running(emulator), lambda p: p == "stopping")
            await env.hub.send("TASK_CANCEL", {"taskId": "stopping", "attempt": 1})
            await wait_until(lambda: bridge.runner.running["stopping"].cancelled)
            await env.hub.send("TASK_ASSIGN", _second(env, "stopping"))
            ack = await env.hub.next("TASK_ACK")
            assert (ack["code"], ack["data"]["attempt"]) == (421, 2)
            assert ack["data"]["taskStatus"] == "REJECTED"


async def test_a_hub_that_comes_back_after_a_long_outage_is_reconnected_to_soon(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 24 item 5: while the hub refuses connections the back-off stays under
    ``reconnect_down_max`` (here 0.05 s), however long the outage, and well under
    ``reconnect_max`` (an hour here): twenty refused tries in a row, then the hub is back
    on its port and the bridge registers."""
    caplog.set_level(logging.INFO, logger="aigcq.agent")
    hub = Hub()
    async with serve_killable(hub.app) as served:
        port = int(served.url.rsplit(":", 1)[1])
        server = served.url.replace("http", "ws") + "/ws"
        update = {"server": server, "reconnect_max": HOUR, "reconnect_down_max": 0.05}
        async with Bridge(env.settings.model_copy(update=update)):
            await hub.next("REGISTER")
            served.kill()

            def refused_tries() -> int:
                return sum("reconnecting in" in r.getMessage() for r in caplog.records)

            await wait_until(lambda: refused_tries() >= 20, 10)
            back = Hub()
            async with serve_killable(back.app, port=port):
                assert (await back.next("REGISTER"))["bridgeId"]


async def test_a_reconnect_sends_undelivered_task_ends_at_once(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 item 5: a TASK_END whose next try is an hour away is sent when the bridge
    has registered again (the hub is back), not an hour later."""
    monkeypatch.setattr("aigcq.agent.spool.backoff_delay", lambda attempt, cap: HOUR)
    env.webhook.fail_first = 10**6  # the hub is away
    async with Bridge(env.settings):
        await env.hub.next("REGISTER")
        await env.hub.send("TASK_ASSIGN", env.assign("waiting"))
        await env.webhook.wait_for(1, within=10)
        env.webhook.fail_first = len(env.webhook.received)  # back
        await env.hub.sockets[-1].close()  # the hub restarted: the bridge reconnects
        await env.hub.next("REGISTER")
        assert (await env.end_for("waiting"))["code"] == 0


async def test_a_cancel_of_a_waiting_prompt_interrupts_no_one_else(
    env: Env, tmp_path: Path
) -> None:
    """ComfyUI before 0.3.56 ignores ``/interrupt``'s ``prompt_id`` and stops whatever
    runs: a task cancelled while its prompt waits behind someone else's must not stop that
    one; it is only deleted from the queue."""
    async with comfy_fleet(tmp_path, 1) as [(served, emulator)]:
        emulator.config.global_interrupt = True
        settings = env.settings.model_copy(update={"comfyui": [served.url]})
        async with Bridge(settings):
            await env.hub.next("REGISTER")
            theirs = {"prompt": GRAPH, "client_id": "someone", "prompt_id": "theirs"}
            await env.http.post(f"{served.url}/prompt", json=theirs)
            await until(lambda: _running(emulator), lambda p: p == "theirs")
            await env.hub.send("TASK_ASSIGN", env.assign("waits", workflow=GRAPH))
            await env.hub.next("TASK_ACK")
            await wait_until(lambda: any(i.prompt_id == "waits" for i in emulator.pending))
            await env.hub.send("TASK_CANCEL", {"taskId": "waits", "attempt": 1})
            await wait_until(lambda: not emulator.pending)
            await until(lambda: _history_status(emulator, "theirs"), bool, within=10)
        assert await _history_status(emulator, "theirs") == "success"
        assert "waits" not in emulator.history


async def _history_status(emulator: ComfyUIEmulator, prompt_id: str) -> str:
    entry = emulator.history.get(prompt_id)
    return str(entry["status"]["status_str"]) if entry else ""


async def test_a_websocket_comfyui_forgot_is_reopened_and_progress_flows_again(
    env: Env, tmp_path: Path
) -> None:
    """ComfyUI forgets a ``clientId`` when any socket of it closes, also an older one
    closing after the bridge's connected (seen on real ComfyUI 0.3.64): the bridge's
    socket then hears nothing, not even ``status``, while its prompts run. Silent since
    the prompt was queued, it is reopened, and the prompt's progress reaches the hub."""
    async with comfy_fleet(tmp_path, 1) as [(served, emulator)]:
        emulator.config.forget_client_on_close = True
        settings = env.settings.model_copy(update={"comfyui": [served.url]})
        async with Bridge(settings) as bridge:
            await env.hub.next("REGISTER")
            await wait_until(lambda: bridge.bridge_id in emulator.sockets)
            ws_url = served.url.replace("http", "ws", 1) + f"/ws?clientId={bridge.bridge_id}"
            async with connect(ws_url):  # closes when done: ComfyUI forgets the clientId
                pass
            await wait_until(lambda: bridge.bridge_id not in emulator.sockets)
            await env.hub.send("TASK_ASSIGN", env.assign("deaf", workflow=GRAPH))
            assert (await env.hub.next("TASK_ACK"))["code"] == 0
            assert (await env.hub.next("TASK_PROGRESS"))["taskId"] == "deaf"
            assert (await env.end_for("deaf"))["code"] == 0


async def test_a_task_id_comfyui_ran_before_gets_its_own_result(env: Env, tmp_path: Path) -> None:
    """The prompt id is the task id, and ComfyUI keeps the history of an earlier prompt of
    that id (a task id used again, on a ComfyUI that outlived the first): while the new
    prompt waits behind someone else's, the silence poll found that old entry and
    delivered its files as this task's result. The old entry is deleted before the prompt
    is sent."""
    async with comfy_fleet(tmp_path, 1) as [(served, emulator)]:
        settings = env.settings.model_copy(update={"comfyui": [served.url]})
        async with Bridge(settings):
            await env.hub.next("REGISTER")
            old = {"prompt": invert_graph("old"), "client_id": "earlier", "prompt_id": "again"}
            await env.http.post(f"{served.url}/prompt", json=old)
            await until(lambda: _history_status(emulator, "again"), bool, within=10)
            theirs = {"prompt": GRAPH, "client_id": "someone", "prompt_id": "theirs"}
            await env.http.post(f"{served.url}/prompt", json=theirs)
            await until(lambda: _running(emulator), lambda p: p == "theirs")
            await env.hub.send("TASK_ASSIGN", env.assign("again", workflow=GRAPH))
            result = await env.end_for("again")
        [file] = result["data"]
        assert file["fileUrl"].rsplit("/", 1)[1].startswith("bt_"), file  # not old_*


async def test_finished_prompts_history_is_deleted_in_one_batch(env: Env, tmp_path: Path) -> None:
    """Each finished prompt's history entry (its outputs, kept by ComfyUI) is deleted once
    the bridge has read it, several by one ``POST /history {"delete": [...]}``: not a
    call per prompt (issue 42 item 14)."""
    config = ComfyUIConfig(output_dir=tmp_path / "output", step_time=0.01, steps=1)
    app = create_app(config)
    emulator: ComfyUIEmulator = app.state.emulator
    async with serve_killable(app) as served:
        settings = env.settings.model_copy(update={"comfyui": [served.url]})
        async with Bridge(settings):
            await env.hub.next("REGISTER")
            for task_id in ("h1", "h2", "h3", "h4"):
                await env.hub.send("TASK_ASSIGN", env.assign(task_id, workflow=GRAPH))
                assert (await env.end_for(task_id))["code"] == 0
            await until(lambda: _history_ids(emulator), lambda ids: not ids, within=10)
        assert emulator.history_posts == 1


async def _history_ids(emulator: ComfyUIEmulator) -> list[str]:
    return list(emulator.history)
