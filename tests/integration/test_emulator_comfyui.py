"""The ComfyUI emulator, spoken to over real HTTP and WebSocket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from aigcq.emulators.comfyui import ComfyUIConfig, ComfyUIEmulator, create_app
from aigcq.emulators.png import tiny_png
from tests.fakes.comfyui import GRAPH, model_graph, read_png
from tests.fakes.servers import serve_app
from tests.fakes.waiting import wait_until


@dataclass
class Comfy:
    url: str
    emulator: ComfyUIEmulator
    http: httpx.AsyncClient

    @property
    def ws_url(self) -> str:
        return self.url.replace("http", "ws", 1)

    async def post_prompt(self, prompt: Any = GRAPH, **extra: Any) -> httpx.Response:
        return await self.http.post(f"{self.url}/prompt", json={"prompt": prompt, **extra})


@pytest.fixture
async def comfy(tmp_path: Path) -> AsyncIterator[Comfy]:
    config = ComfyUIConfig(output_dir=tmp_path / "output", step_time=0.005, steps=2)
    app = create_app(config)
    async with serve_app(app) as url, httpx.AsyncClient() as http:
        yield Comfy(url, app.state.emulator, http)


async def events_until_done(ws: ClientConnection, prompt_id: str) -> list[dict[str, Any]]:
    """Every event up to and including ``executing {node: null}`` for ``prompt_id``."""
    events = []
    async with asyncio.timeout(10):
        while True:
            event = json.loads(await ws.recv())
            events.append(event)
            data = event["data"]
            if event["type"] == "executing" and data == {"node": None, "prompt_id": prompt_id}:
                return events


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events if e["type"] not in ("status", "progress", "progress_state")]


async def test_minimal_graph_makes_a_png_with_faithful_events(comfy: Comfy) -> None:
    async with connect(f"{comfy.ws_url}/ws?clientId=me") as ws:
        first = json.loads(await ws.recv())
        assert first == {
            "type": "status",
            "data": {"status": {"exec_info": {"queue_remaining": 0}}, "sid": "me"},
        }
        resp = await comfy.post_prompt(client_id="me", prompt_id="task-1")
        assert resp.status_code == 200
        assert resp.json() == {"prompt_id": "task-1", "number": 0, "node_errors": {}}
        events = await events_until_done(ws, "task-1")
        # history is written before the final executing {node: null}
        history = (await comfy.http.get(f"{comfy.url}/history/task-1")).json()

    assert kinds(events) == [
        "execution_start",
        "execution_cached",
        "executing",
        "executing",
        "executing",
        "executed",
        "execution_success",
        "executing",
    ]
    assert [e["data"]["node"] for e in events if e["type"] == "executing"] == ["1", "2", "3", None]
    progress = [e["data"] for e in events if e["type"] == "progress"]
    assert progress[:2] == [
        {"value": 1, "max": 2, "prompt_id": "task-1", "node": "1"},
        {"value": 2, "max": 2, "prompt_id": "task-1", "node": "1"},
    ]
    # progress_state (ComfyUI 0.3.4x+): every node seen so far, finished at the end
    last_state = [e["data"] for e in events if e["type"] == "progress_state"][-1]
    assert last_state["prompt_id"] == "task-1"
    assert {n: (v["state"], v["value"]) for n, v in last_state["nodes"].items()} == {
        n: ("finished", 2.0) for n in ("1", "2", "3")
    }
    entry = history["task-1"]
    image = {"filename": "bt_00001_.png", "subfolder": "", "type": "output"}
    assert entry["outputs"] == {"3": {"images": [image]}}
    assert entry["status"]["status_str"] == "success"
    assert entry["status"]["completed"] is True
    assert entry["prompt"][1] == "task-1"
    view = await comfy.http.get(f"{comfy.url}/view", params=image)
    assert view.status_code == 200
    assert read_png(view.content) == (64, 48, bytes([0, 255, 255]))  # red, inverted


async def test_events_go_only_to_the_prompts_client(comfy: Comfy) -> None:
    async with (
        connect(f"{comfy.ws_url}/ws?clientId=a") as a,
        connect(f"{comfy.ws_url}/ws?clientId=b") as b,
    ):
        await comfy.post_prompt(client_id="a", prompt_id="p")
        await events_until_done(a, "p")
        others: list[str] = []
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                while True:
                    others.append(json.loads(await b.recv())["type"])
        assert set(others) == {"status"}


async def test_second_run_reuses_cache_and_counts_files(comfy: Comfy) -> None:
    async with connect(f"{comfy.ws_url}/ws?clientId=c") as ws:
        for pid in ("one", "two"):
            await comfy.post_prompt(client_id="c", prompt_id=pid)
            events = await events_until_done(ws, pid)
    cached = next(e for e in events if e["type"] == "execution_cached")
    assert cached["data"]["nodes"] == ["1", "2"]
    history = (await comfy.http.get(f"{comfy.url}/history/two")).json()
    assert history["two"]["outputs"]["3"]["images"][0]["filename"] == "bt_00002_.png"


@pytest.mark.parametrize(
    ("body", "error_type"),
    [
        ({}, "no_prompt"),
        ({"prompt": {"1": {"class_type": "Nope", "inputs": {}}}}, "invalid_prompt"),
        ({"prompt": {"1": {"inputs": {}}}}, "invalid_prompt"),
        ({"prompt": {"1": GRAPH["1"], "2": GRAPH["2"]}}, "prompt_no_outputs"),
    ],
)
async def test_prompt_level_errors(comfy: Comfy, body: Any, error_type: str) -> None:
    resp = await comfy.http.post(f"{comfy.url}/prompt", json=body)
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == error_type
    assert resp.json()["node_errors"] == {}


async def test_node_errors(comfy: Comfy) -> None:
    graph = json.loads(json.dumps(GRAPH))
    graph["1"]["inputs"]["width"] = 0
    del graph["3"]["inputs"]["filename_prefix"]
    resp = await comfy.post_prompt(graph)
    assert resp.status_code == 400
    body = resp.json()
    assert body["error"]["type"] == "prompt_outputs_failed_validation"
    assert body["error"]["message"] == "Prompt outputs failed validation"
    errors = body["node_errors"]
    assert errors["1"]["class_type"] == "EmptyImage"
    assert errors["1"]["dependent_outputs"] == ["3"]
    assert [e["type"] for e in errors["1"]["errors"]] == ["value_smaller_than_min"]
    assert errors["1"]["errors"][0]["extra_info"]["input_name"] == "width"
    assert [e["type"] for e in errors["3"]["errors"]] == ["required_input_missing"]


async def test_partly_valid_prompt_runs_the_good_output(comfy: Comfy) -> None:
    graph = {**GRAPH, "4": {"class_type": "PreviewImage", "inputs": {"images": ["9", 0]}}}
    resp = await comfy.post_prompt(graph)
    assert resp.status_code == 200
    assert resp.json()["node_errors"]["4"]["errors"][0]["type"] == "bad_linked_input"


async def test_malformed_json_is_a_server_error(comfy: Comfy) -> None:
    resp = await comfy.http.post(f"{comfy.url}/prompt", content=b"{nope")
    assert resp.status_code == 500


async def test_interrupt_and_queue(comfy: Comfy) -> None:
    comfy.emulator.config.step_time = 0.2
    async with connect(f"{comfy.ws_url}/ws?clientId=i") as ws:
        await comfy.post_prompt(client_id="i", prompt_id="run")
        await comfy.post_prompt(client_id="i", prompt_id="wait")
        queue = (await comfy.http.get(f"{comfy.url}/queue")).json()
        assert [q[1] for q in queue["queue_running"]] == ["run"]
        assert [q[1] for q in queue["queue_pending"]] == ["wait"]
        assert (await comfy.http.get(f"{comfy.url}/prompt")).json() == {
            "exec_info": {"queue_remaining": 2}
        }
        await comfy.http.post(f"{comfy.url}/queue", json={"delete": ["wait"]})
        await comfy.http.post(f"{comfy.url}/interrupt", json={"prompt_id": "other"})  # no-op
        await comfy.http.post(f"{comfy.url}/interrupt", json={})
        events = await events_until_done(ws, "run")
    assert "execution_interrupted" in kinds(events)
    entry = (await comfy.http.get(f"{comfy.url}/history/run")).json()["run"]
    assert entry["status"]["status_str"] == "error"
    assert entry["status"]["messages"][-1][0] == "execution_interrupted"
    assert (await comfy.http.get(f"{comfy.url}/history/wait")).json() == {}


async def test_injected_failure(comfy: Comfy) -> None:
    await comfy.http.post(f"{comfy.url}/emulator/fail", json={"next": 1})
    async with connect(f"{comfy.ws_url}/ws?clientId=f") as ws:
        await comfy.post_prompt(client_id="f", prompt_id="bad")
        events = await events_until_done(ws, "bad")
        await comfy.post_prompt(client_id="f", prompt_id="good")
        assert "execution_success" in kinds(await events_until_done(ws, "good"))
    error = next(e for e in events if e["type"] == "execution_error")["data"]
    assert error["node_id"] == "3"
    assert error["node_type"] == "SaveImage"
    assert "Injected failure" in error["exception_message"]
    history = (await comfy.http.get(f"{comfy.url}/history")).json()
    assert history["bad"]["status"]["status_str"] == "error"


async def test_view_rules(comfy: Comfy) -> None:
    async def view(**params: str) -> int:
        return (await comfy.http.get(f"{comfy.url}/view", params=params)).status_code

    assert await view(filename="missing.png") == 404
    assert await view(filename="../x.png") == 400
    assert await view(filename="/etc/passwd") == 400
    assert await view(filename="x.png", subfolder="../../") == 403
    assert await view(filename="x.png", type="bogus") == 400


async def test_api_prefix(comfy: Comfy) -> None:
    api = f"{comfy.url}/api"
    resp = await comfy.http.post(f"{api}/prompt", json={"prompt": GRAPH, "prompt_id": "x"})
    assert resp.status_code == 200

    async def finished() -> Any:
        return (await comfy.http.get(f"{api}/history/x")).json()

    await wait_until(finished, 5.0, what="prompt x in /api/history")
    assert set((await comfy.http.get(f"{api}/queue")).json()) == {"queue_running", "queue_pending"}
    stats = (await comfy.http.get(f"{api}/system_stats")).json()
    assert stats["devices"][0]["type"] == "cpu"
    info = (await comfy.http.get(f"{api}/object_info")).json()
    assert {"EmptyImage", "ImageInvert", "SaveImage"} <= set(info)
    assert info["SaveImage"]["output_node"] is True
    async with connect(f"{comfy.ws_url}/api/ws?clientId=z") as ws:
        assert json.loads(await ws.recv())["data"]["sid"] == "z"


async def test_each_instance_has_its_node_classes_and_model_files(tmp_path: Path) -> None:
    config = ComfyUIConfig(
        output_dir=tmp_path / "output",
        step_time=0.005,
        steps=1,
        node_classes=frozenset({"CheckpointLoaderSimple", "EmptyLatentImage", "VAEDecode"})
        | {"SaveImage"},
        checkpoints=("a.safetensors", "b.safetensors"),
        model_load_time=0.05,
    )
    app = create_app(config)
    async with serve_app(app) as url, httpx.AsyncClient() as http:
        info = (await http.get(f"{url}/object_info")).json()
        assert set(info) == {"CheckpointLoaderSimple", "EmptyLatentImage", "VAEDecode", "SaveImage"}
        ckpt = info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"]
        assert ckpt == [["a.safetensors", "b.safetensors"], {}]
        missing = await http.post(f"{url}/prompt", json={"prompt": GRAPH})
        assert missing.status_code == 400
        assert missing.json()["error"]["type"] == "invalid_prompt"  # no EmptyImage here
        bad = await http.post(f"{url}/prompt", json={"prompt": model_graph("c.safetensors")})
        assert bad.status_code == 400
        [error] = bad.json()["node_errors"]["4"]["errors"]
        assert (error["type"], error["message"]) == ("value_not_in_list", "Value not in list")
        assert error["details"].startswith("ckpt_name: 'c.safetensors' not in")
        for ckpt_name in ("a.safetensors", "a.safetensors", "b.safetensors"):
            resp = await http.post(f"{url}/prompt", json={"prompt": model_graph(ckpt_name)})
            assert resp.status_code == 200, resp.text
        emulator: ComfyUIEmulator = app.state.emulator
        await wait_until(lambda: not (emulator.pending or emulator.running))
        stats = (await http.get(f"{url}/emulator/stats")).json()
        assert (stats["loads"], stats["loaded"]) == (2, "b.safetensors")  # a, then b
        assert stats["loadingS"] == pytest.approx(0.1) and stats["busyS"] >= stats["loadingS"]


async def test_upload_image_then_load_image_as_comfyui(comfy: Comfy) -> None:
    """``/upload/image`` puts a file in the input folder (renamed when the name holds other
    bytes, unless overwrite); ``LoadImage`` reads it; a missing file fails the node."""
    png = tiny_png((1, 2, 3), size=5)
    url = f"{comfy.url}/upload/image"
    first = await comfy.http.post(url, files={"image": ("in.png", png)}, data={"type": "input"})
    assert first.json() == {"name": "in.png", "subfolder": "", "type": "input"}
    same = await comfy.http.post(url, files={"image": ("in.png", png)})
    assert same.json()["name"] == "in.png"  # the same bytes: the same file
    other = await comfy.http.post(url, files={"image": ("in.png", png + b"x")})
    assert other.json()["name"] == "in (1).png"
    over = await comfy.http.post(
        url, files={"image": ("in.png", png + b"y")}, data={"overwrite": "true"}
    )
    assert over.json()["name"] == "in.png"
    assert (await comfy.http.post(url, content=b"x")).status_code == 400
    assert comfy.emulator.uploads == ["in.png", "in.png", "in (1).png", "in.png"]
    await comfy.http.post(url, files={"image": ("in.png", png)}, data={"overwrite": "1"})
    graph: dict[str, Any] = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "in.png"}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "l"}},
    }
    prompt_id = (await comfy.post_prompt(graph)).json()["prompt_id"]
    entry = await wait_until(lambda: comfy.emulator.history.get(prompt_id) or {})
    [image] = entry["outputs"]["3"]["images"]
    view = await comfy.http.get(f"{comfy.url}/view", params=image)
    assert read_png(view.content) == (5, 5, bytes([254, 253, 252]))
    graph["1"]["inputs"]["image"] = "missing.png"
    prompt_id = (await comfy.post_prompt(graph)).json()["prompt_id"]
    entry = await wait_until(lambda: comfy.emulator.history.get(prompt_id) or {})
    assert entry["status"]["status_str"] == "error"  # Invalid image file
