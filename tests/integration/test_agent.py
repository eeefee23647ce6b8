"""The reference bridge against two ComfyUI emulators and a tiny test hub + webhook receiver.

The hub here is a test fixture (any WebSocket server speaking the bridge protocol would
do): it records what the bridge sends, lets the test send TASK_ASSIGN/PING, and serves
one workflow from ``/api/workflows/{id}`` as aigcq's registry does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from aigcq.agent.app import Bridge
from aigcq.emulators.comfyui import ComfyUIConfig, create_app
from tests.fakes.agent import same_port
from tests.fakes.agent_hub import TOKEN, Env, Hub, assign_three_to_two, env
from tests.fakes.comfyui import GRAPH, model_graph, read_png
from tests.fakes.servers import serve_app, serve_handler, stream_until_answered
from tests.fakes.waiting import wait_until

__all__ = ["env"]  # a fixture: imported for pytest to find


async def test_assign_ack_task_end_with_a_png(env: Env) -> None:
    async with Bridge(env.settings) as bridge:
        register = await env.hub.next("REGISTER")
        assert register["bridgeId"] == bridge.bridge_id
        assert (env.settings.data_dir / "bridge_id").read_text().strip() == bridge.bridge_id
        assert (register["instanceCount"], register["availableInstanceCount"]) == (2, 2)
        assert {i["state"] for i in register["instances"]} == {"idle"}
        assert register["tasks"] == []
        node_info = [
            {"nodeId": "1", "fieldName": "color", "fieldValue": "255"},
            {"nodeId": "3", "fieldName": "filename_prefix", "fieldValue": "out"},
        ]
        await env.hub.send("TASK_ASSIGN", env.assign("t1", nodeInfoList=node_info))
        ack = await env.hub.next("TASK_ACK")
        assert ack == {
            "code": 0,
            "msg": "success",
            "data": {"taskId": "t1", "taskStatus": "RUNNING", "attempt": 1},
        }
        progress = await env.hub.next("TASK_PROGRESS")
        assert progress["taskId"] == "t1"
        assert progress["max"] == 2
        result = await env.end_for("t1")
        assert result["code"] == 0
        [file] = result["data"]
        assert (file["fileType"], file["nodeId"]) == ("png", "3")
        url = file["fileUrl"]
        assert url.startswith(f"{bridge.public_url}/files/"), url  # signed: test_agent_files.py
        assert url.endswith("/t1/out_00001_.png"), url
        image = await env.http.get(url)
        assert image.status_code == 200
        assert read_png(image.content) == (64, 48, bytes([255, 255, 0]))  # blue, inverted
        await env.hub.send("PING")
        assert await env.hub.next("PONG") == {}
        beat = await env.hub.next("HEARTBEAT")
        assert (beat["availableInstanceCount"], beat["busyInstanceCount"]) == (2, 0)
        assert beat["tasks"] == []


async def test_least_busy_instance_and_capacity(env: Env) -> None:
    async with Bridge(env.settings):
        acks = await assign_three_to_two(env)
        assert {t: a["code"] for t, a in acks.items()} == {"a": 0, "b": 0, "c": 421}
        assert (await env.end_for("a"))["code"] == 0
        assert (await env.end_for("b"))["code"] == 0
    prompts = [
        set((await env.http.get(f"{url}/history")).json()) for url in env.comfy
    ]  # one prompt on each instance, named after the task
    assert sorted(prompts, key=sorted) == [{"a"}, {"b"}]


async def test_silent_comfyui_websocket_falls_back_to_history(env: Env) -> None:
    async def silent(*args: Any, **kwargs: Any) -> None:
        return None

    for emulator in env.emulators:
        emulator.send = silent  # type: ignore[method-assign]
    async with Bridge(env.settings):
        await env.hub.next("REGISTER")
        await env.hub.send("TASK_ASSIGN", env.assign("quiet"))
        assert (await env.end_for("quiet"))["code"] == 0


async def test_failures_end_with_code_1_or_a_rejection(env: Env) -> None:
    for url in env.comfy:
        await env.http.post(f"{url}/emulator/fail", json={"next": 1})
    async with Bridge(env.settings):
        await env.hub.next("REGISTER")
        await env.hub.send("TASK_ASSIGN", env.assign("boom"))
        assert (await env.hub.next("TASK_ACK"))["code"] == 0
        result = await env.end_for("boom")
        assert result["code"] == 1
        assert "Injected failure" in result["msg"]
        assert result["data"] == []

        bad_node = [{"nodeId": "42", "fieldName": "color", "fieldValue": 1}]
        await env.hub.send("TASK_ASSIGN", env.assign("bad-node", nodeInfoList=bad_node))
        assert (await env.hub.next("TASK_ACK"))["code"] == 0
        assert "node '42' is not in the workflow" in (await env.end_for("bad-node"))["msg"]

        await env.hub.send("TASK_ASSIGN", env.assign("lost", workflowId="nope"))
        ack = await env.hub.next("TASK_ACK")
        assert (ack["code"], ack["data"]["taskId"]) == (380, "lost")


async def test_spooled_result_survives_a_restart(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aigcq")
    env.webhook.fail_first = 10**6  # the hub refuses every TASK_END for now
    spooled = env.settings.data_dir / "spool" / "keep.json"
    async with Bridge(env.settings) as first:
        await env.hub.next("REGISTER")
        await env.hub.send("TASK_ASSIGN", env.assign("keep"))
        await env.webhook.wait_for(1, within=10)
        assert spooled.exists()

        await wait_until(lambda: "task keep: TASK_END try 1 failed (HTTP 500)" in caplog.text)
    assert spooled.exists()
    tries = len(env.webhook.received)
    env.webhook.fail_first = tries  # from now on, accept
    async with Bridge(same_port(env.settings, first)):  # the spooled fileUrl names its port
        register = await env.hub.next("REGISTER")
        assert register["tasks"] == ["keep"]
        result = await env.end_for("keep")
        assert result["code"] == 0
        image = await env.http.get(result["data"][0]["fileUrl"])
        assert read_png(image.content)[:2] == (64, 48)

        await wait_until(lambda: not spooled.exists())


@pytest.mark.parametrize(("status", "dropped"), [(400, True), (403, True), (429, False)])
async def test_a_task_end_refused_for_good_is_not_sent_forever(
    env: Env, status: int, dropped: bool
) -> None:
    """A 4xx other than 404/410/408/429 (a body or signature the hub will never take) ends
    the deliveries; 429 and 5xx are tried again."""
    env.webhook.fail_first, env.webhook.fail_status = 10**6, status
    spooled = env.settings.data_dir / "spool" / "refused.json"
    async with Bridge(env.settings):
        await env.hub.next("REGISTER")
        await env.hub.send("TASK_ASSIGN", env.assign("refused"))
        if dropped:
            await env.webhook.wait_for(1, within=10)
            await wait_until(lambda: not spooled.exists())
            await asyncio.sleep(1.0)  # time: a retry would come within the first back-off
            assert len(env.webhook.received) == 1
        else:
            await env.webhook.wait_for(2, within=10)
            assert spooled.exists()


async def test_server_address_changes_at_run_time(env: Env, tmp_path: Path) -> None:
    other = Hub()
    async with serve_app(other.app) as other_url, Bridge(env.settings) as bridge:
        first = await env.hub.next("REGISTER")
        admin = bridge.public_url
        new = other_url.replace("http", "ws") + "/ws"
        refused = await env.http.post(f"{admin}/api/server", json={"url": new})
        assert refused.status_code == 401
        resp = await env.http.post(
            f"{admin}/api/server",
            json={"url": new},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert resp.status_code == 200
        again = await other.next("REGISTER")
        assert again["bridgeId"] == first["bridgeId"]
        status = (await env.http.get(f"{admin}/api/status")).json()
        assert status["server"] == new
        assert status["connection"]["state"] == "connected"
        page = await env.http.get(f"{admin}/")
        assert new in page.text
        assert (await env.http.get(f"{admin}/healthz")).json() == {"status": "ok"}


class _Control:
    """The bridge's side of the admin server, recording address changes."""

    token = "admin-page-token"
    files_dir = Path("/nonexistent")

    def __init__(self) -> None:
        self.servers: list[str] = []

    def status(self) -> dict[str, Any]:
        return {}

    async def set_server(self, url: str) -> None:
        self.servers.append(url)


@pytest.mark.parametrize(("bearer", "status"), [("forged", 401), (_Control.token, 413), ("", 413)])
async def test_the_admin_server_refuses_a_huge_chunked_body_before_reading_it(
    bearer: str, status: int
) -> None:
    """Issue 15 item 13: authenticate first (a bearer token), then read with a limit."""
    from aigcq.agent.web import bridge_routes

    control = _Control()
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    async with serve_handler(bridge_routes(control)) as base:
        upload = await stream_until_answered(base, "POST", "/api/server", headers, 32 << 20)
    assert upload.status == status and upload.sent < 32 << 20
    assert control.servers == []


async def test_the_file_server_answers_only_files_the_bridge_produced(env: Env) -> None:
    async with Bridge(env.settings) as bridge:
        base = bridge.public_url
        for path in ("/files/../bridge_id", "/files/%2E%2E/bridge_id", "/files/x/..%2Fbridge_id"):
            async with httpx.AsyncClient() as http:
                url = httpx.URL(base + path)
                request = http.build_request("GET", url)
                request.url = url.copy_with(raw_path=path.encode())  # sent as written
                assert (await http.send(request)).status_code in (403, 404), path


async def test_an_instance_that_goes_away_is_reported_at_once(env: Env, tmp_path: Path) -> None:
    """HEARTBEATs are 30 s apart here: the news comes in a HEARTBEAT out of turn."""
    config = ComfyUIConfig(output_dir=tmp_path / "own" / "output", step_time=0.03, steps=2)
    app = create_app(config)
    async with contextlib.AsyncExitStack() as stack:
        own = await stack.enter_async_context(serve_app(app))
        settings = env.settings.model_copy(update={"comfyui": [env.comfy[0], own], "heartbeat": 30})
        async with Bridge(settings):
            register = await env.hub.next("REGISTER")
            assert register["availableInstanceCount"] == 2
            await stack.aclose()  # the instance goes away
            beat = await env.hub.next("HEARTBEAT", timeout=5.0)
            assert beat["availableInstanceCount"] == 1
            states = {i["url"]: i["state"] for i in beat["instances"]}
            assert states[own] == "offline"


async def test_tasks_go_to_the_instance_with_their_model_loaded_or_fail_clearly(
    env: Env, tmp_path: Path
) -> None:
    checkpoints = [("a.safetensors", "b.safetensors"), ("b.safetensors",)]
    apps = [
        create_app(
            ComfyUIConfig(output_dir=tmp_path / f"m{i}" / "output", step_time=0.01, steps=1,
                          checkpoints=ckpts)
        )
        for i, ckpts in enumerate(checkpoints)
    ]  # fmt: skip
    async with contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serve_app(app)) for app in apps]
        settings = env.settings.model_copy(update={"comfyui": urls})
        async with Bridge(settings) as bridge:
            register = await env.hub.next("REGISTER")
            offered = {i["url"]: i["models"] for i in register["instances"]}
            assert offered == {urls[0]: list(checkpoints[0]), urls[1]: list(checkpoints[1])}
            assert "CheckpointLoaderSimple" in register["instances"][0]["nodeClasses"]

            async def run(task_id: str, ckpt: str) -> dict[str, Any]:
                graph = model_graph(ckpt)
                await env.hub.send("TASK_ASSIGN", env.assign(task_id, workflow=graph))
                return await env.end_for(task_id)

            assert (await run("only-first", "a.safetensors"))["code"] == 0
            assert list(apps[0].state.emulator.history) == ["only-first"]
            failed = await run("nowhere", "c.safetensors")
            assert failed["failure"]["code"] == "NoCapableInstance"
            assert "model files: c.safetensors" in failed["msg"]
            history = {url: app.state.emulator.history for url, app in zip(urls, apps, strict=True)}
            assert (await run("b-1", "b.safetensors"))["code"] == 0
            [loaded_on] = [url for url in urls if "b-1" in history[url]]
            for task_id in ("b-2", "b-3"):  # where b is loaded
                assert (await run(task_id, "b.safetensors"))["code"] == 0
                assert task_id in history[loaded_on]
            instance = bridge.pool.by_url(loaded_on)
            assert instance is not None and instance.loaded == {"b.safetensors"}


async def test_each_instance_reports_its_device_and_vram(env: Env, tmp_path: Path) -> None:
    """From ComfyUI's ``/system_stats``, in REGISTER and, as VRAM use changes, HEARTBEAT."""
    gib = 2**30
    config = ComfyUIConfig(
        output_dir=tmp_path / "gpu" / "output",
        device="cuda:0 NVIDIA L4 : cudaMallocAsync",
        vram_total=24 * gib,
        vram_free=20 * gib,
    )
    async with serve_app(create_app(config)) as url:
        settings = env.settings.model_copy(update={"comfyui": [url]})
        async with Bridge(settings):
            [instance] = (await env.hub.next("REGISTER"))["instances"]
            assert instance["device"] == "cuda:0 NVIDIA L4 : cudaMallocAsync"
            assert (instance["vramTotal"], instance["vramFree"]) == (24 * gib, 20 * gib)
            config.vram_free = 6 * gib  # a model loaded
            for _ in range(30):
                [instance] = (await env.hub.next("HEARTBEAT", timeout=5.0))["instances"]
                if instance["vramFree"] == 6 * gib:
                    break
            assert instance["vramFree"] == 6 * gib


async def test_progress_names_the_node_by_its_title_or_class(env: Env) -> None:
    """Issue 18 item 8: the spinner shows the node's name, not only its id."""
    graph = json.loads(json.dumps(GRAPH))
    graph["2"]["_meta"] = {"title": "Invert colours"}
    async with Bridge(env.settings):
        await env.hub.next("REGISTER")
        await env.hub.send("TASK_ASSIGN", env.assign("named", workflow=graph))
        names: dict[str, str] = {}
        while len(names) < len(graph):
            progress = await env.hub.next("TASK_PROGRESS")
            names[progress["node"]] = progress["nodeName"]
        assert names == {
            node_id: "Invert colours" if node_id == "2" else node["class_type"]
            for node_id, node in graph.items()
        }
        assert (await env.end_for("named"))["code"] == 0


async def test_a_task_goes_to_the_instance_the_hub_named_if_it_is_free(
    env: Env, tmp_path: Path
) -> None:
    """TASK_ASSIGN ``instanceId`` (issue 24, item 3): the hub counted the task on that
    instance; the bridge takes it there (both are idle: its own choice would be the
    first), or, that one busy, on another that can run it."""
    apps = [
        create_app(ComfyUIConfig(output_dir=tmp_path / f"n{i}" / "output", step_time=0.2))
        for i in range(2)
    ]
    async with contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serve_app(app)) for app in apps]
        settings = env.settings.model_copy(update={"comfyui": urls})
        async with Bridge(settings):
            register = await env.hub.next("REGISTER")
            assert [i["slots"] for i in register["instances"]] == [1, 1]
            second = register["instances"][1]["instanceId"]
            await env.hub.send("TASK_ASSIGN", env.assign("named", instanceId=second))
            assert (await env.hub.next("TASK_ACK"))["code"] == 0
            await env.hub.send("TASK_ASSIGN", env.assign("taken", instanceId=second))
            assert (await env.hub.next("TASK_ACK"))["code"] == 0
            assert (await env.end_for("named"))["code"] == 0
            assert (await env.end_for("taken"))["code"] == 0
            assert list(apps[1].state.emulator.history) == ["named"]
            assert list(apps[0].state.emulator.history) == ["taken"]
