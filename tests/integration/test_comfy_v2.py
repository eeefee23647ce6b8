"""The Comfy API v2 door driven by the unchanged official client, ``comfy-sdk``, against a
real serve (real Redis), the real ``aigcq bridge`` and ComfyUI emulators: a v2 job is an
aigcq task run as an inline workflow on a bridge."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import blake3
import httpx
import pytest
import redis.asyncio as aioredis
from comfy_sdk import AsyncComfy
from comfy_sdk.events import Log, StatusChange
from comfy_sdk.exceptions import IdempotencyKeyReuse, InvalidWorkflow, NotFound, WorkflowFormatUi
from comfy_sdk.workflows import Workflow

from aigcq.config import PlatformConfig
from aigcq.emulators.comfyui import ComfyUIEmulator
from aigcq.plumbing.auth import issue_client_token
from aigcq.serve.server import ServeProcess
from tests.fakes.comfy_v2 import base as origin
from tests.fakes.comfy_v2 import official_client
from tests.fakes.comfyui import invert_graph, read_png
from tests.fakes.fleet import SECRET, Fleet, fleet
from tests.fakes.servers import serve_app
from tests.fakes.waiting import until

GRAPH = invert_graph("v2")
UI_GRAPH: dict[str, Any] = {"last_node_id": 3, "last_link_id": 1, "nodes": [], "links": []}


@pytest.fixture
async def gpu(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Fleet]:
    """One ComfyUI behind a bridge, prompts of about 1.5 s, no paid platform; the v2
    door's queue is the default project's (``aigcq``)."""
    steps = {"step_time": 0.3, "steps": 5}
    async with fleet(
        tmp_path, redis, redis_url, [1], paid=0, projects=("aigcq",), comfy=lambda _i: steps
    ) as f:
        yield f


@pytest.fixture
async def sdk(gpu: Fleet, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[AsyncComfy]:
    """The official client, set up as its README says: the base URL and the API key."""
    async with official_client(gpu, monkeypatch) as c:
        yield c


async def _running(emulator: ComfyUIEmulator) -> str:
    return emulator.running.prompt_id if emulator.running else ""


async def test_submit_wait_download_events_and_list(gpu: Fleet, sdk: AsyncComfy) -> None:
    job = await sdk.submit(Workflow(GRAPH), metadata={"run": "r1", "who": "test"})
    assert job.status == "queued"
    task = await gpu.task(job.id)  # the job IS the task: same store, same queue
    assert (task.platform, task.aigc, task.backend_id) == ("comfyui", "aigcq", "v2-user")
    assert task.payload["workflow"] == GRAPH
    seen = [event async for event in job.events()]
    assert isinstance(seen[-1], StatusChange) and seen[-1].status == "succeeded"
    assert {type(e).__name__ for e in seen} >= {"StatusChange", "OutputReady", "Progress", "Log"}
    logs = [(e.level, e.message) for e in seen if isinstance(e, Log)]
    assert ("info", "running on bridge") in logs  # what the bridge reported, as log lines
    assert any(m.startswith("node ") and m.endswith(" runs") for _, m in logs)
    assert logs[-1] == ("info", "succeeded: 1 outputs")
    await job.result()
    assert job.status == "succeeded"
    [out] = job.outputs
    assert (out.node_id, out.type, out.content_type) == ("3", "image", "image/png")
    data = await out.to_bytes()
    assert read_png(data) == (64, 48, bytes([0, 255, 255]))  # red, inverted
    assert await out.to_bytes(range=(0, 7)) == data[:8]
    assert out.size_bytes == len(data)  # measured by aigcq (the proxy says 0, null)
    assert job._model.outputs[0].hash == f"blake3:{blake3.blake3(data).hexdigest()}"
    model = job._model
    assert model.started_at is not None and model.completed_at is not None
    assert model.started_at <= model.completed_at
    assert model.metrics is not None and model.metrics["execution_ms"] is not None
    assert str(model.outputs[0].url).startswith(f"{origin(gpu)}/api/v2/assets/")
    workflow = await job.get_workflow()
    assert (workflow.graph, workflow.format) == (GRAPH, "api")
    again = await sdk.jobs.get(job.id)
    assert again.status == "succeeded" and again.metadata == {"run": "r1", "who": "test"}
    found = [s.id async for s in sdk.list_jobs(metadata={"run": "r1"})]
    assert found == [job.id]
    assert [s.id async for s in sdk.list_jobs(metadata={"run": "other"})] == []


async def test_cancel_while_queued_and_while_running_reaches_the_gpu(
    gpu: Fleet, sdk: AsyncComfy
) -> None:
    first = await sdk.submit(Workflow(GRAPH))
    await until(lambda: _running(gpu.comfy[0]), lambda p: p == first.id, within=10)
    second = await sdk.submit(Workflow(invert_graph("v2b")))
    await second.refresh()
    assert (second.status, second._model.queue_position) == ("queued", 1)
    await second.cancel()
    assert second.status == "canceled"
    await second.cancel()  # idempotent
    assert second.status == "canceled"
    await first.refresh()
    assert first.status == "running"
    await first.cancel()
    assert first.status == "canceled"
    entry = await until(
        lambda: _history(gpu.comfy[0], first.id), bool, within=10
    )  # the prompt was interrupted on the GPU
    assert entry["status"]["messages"][-1][0] == "execution_interrupted"
    assert second.id not in gpu.comfy[0].history  # never ran
    third = await sdk.submit(Workflow(invert_graph("v2c")))
    await third.wait(timeout=15)
    assert third.status == "succeeded"


async def _history(emulator: ComfyUIEmulator, prompt_id: str) -> dict[str, Any]:
    return emulator.history.get(prompt_id) or {}


async def test_a_key_is_single_use_and_its_reuse_names_the_job(gpu: Fleet, sdk: AsyncComfy) -> None:
    key = f"key-{uuid.uuid4()}"
    job = await sdk.submit(Workflow(GRAPH), idempotency_key=key)
    with pytest.raises(IdempotencyKeyReuse) as reuse:
        await sdk.submit(Workflow(GRAPH), idempotency_key=key)
    assert reuse.value.details is not None and reuse.value.details["job_id"] == job.id
    with pytest.raises(IdempotencyKeyReuse):
        await sdk.submit(Workflow(invert_graph("other")), idempotency_key=key)  # any body
    await job.wait(timeout=15)


async def test_unknown_job_bad_graphs_and_auth(gpu: Fleet, sdk: AsyncComfy) -> None:
    with pytest.raises(NotFound):
        await sdk.jobs.get(str(uuid.uuid4()))
    with pytest.raises(WorkflowFormatUi):  # refused by the SDK itself, before any request
        await sdk.submit(Workflow(UI_GRAPH))
    bad = {"1": {"class_type": "SaveImage", "inputs": {"images": ["9", 0]}}}
    with pytest.raises(InvalidWorkflow) as invalid:
        await sdk.submit(Workflow(bad))
    assert invalid.value.details == {
        "node_errors": {"1": [{"field": "images", "reason": "link_to_missing_node"}]}
    }
    token = issue_client_token(SECRET, "v2-user")
    async with httpx.AsyncClient(base_url=origin(gpu)) as http:
        auth = {"Authorization": f"Bearer {token}"}
        ui = await http.post("/api/v2/jobs", json={"workflow": UI_GRAPH}, headers=auth)
        assert ui.status_code == 422 and ui.json()["error"]["code"] == "workflow_format_ui"
        anonymous = await http.post("/api/v2/jobs", json={"workflow": GRAPH})
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["code"] == "unauthorized"
        text = await http.post(  # comfy-api-proxy's form of labels: one string
            "/api/v2/jobs", json={"workflow": GRAPH, "metadata": "a=1&b=2"}, headers=auth
        )
        assert text.status_code == 201 and text.json()["metadata"] == "a=1&b=2"
        health = await http.get("/api/v2/health")
        assert health.status_code == 200
    other = issue_client_token(SECRET, "someone-else")
    job = await sdk.submit(Workflow(GRAPH))
    async with httpx.AsyncClient(base_url=origin(gpu)) as http:
        theirs = await http.get(
            f"/api/v2/jobs/{job.id}", headers={"Authorization": f"Bearer {other}"}
        )
        assert theirs.status_code == 404 and theirs.json()["error"]["code"] == "not_found"
        scoped = issue_client_token(SECRET, "someone-else", ids=["v2-user"])  # names its id
        ours = await http.get(
            f"/api/v2/jobs/{job.id}", headers={"Authorization": f"Bearer {scoped}"}
        )
        assert ours.status_code == 200 and ours.json()["id"] == job.id
    await job.wait(timeout=15)


async def test_a_full_queue_is_429_and_the_sdk_retries_at_its_pace(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = {"step_time": 0.3, "steps": 5}
    async with fleet(
        tmp_path,
        redis,
        redis_url,
        [1],
        paid=0,
        projects=("studio",),
        comfy=lambda _i: steps,
        comfy_v2_project="studio",
        comfy_v2_max_waiting=1,
    ) as f:
        monkeypatch.setenv("COMFY_BASE_URL", origin(f))
        token = issue_client_token(SECRET, "v2-user")
        async with AsyncComfy(api_key=token, timeout=15.0) as sdk:
            running = await sdk.submit(Workflow(GRAPH))
            await until(lambda: _running(f.comfy[0]), lambda p: p == running.id, within=10)
            waiting = await sdk.submit(Workflow(invert_graph("w")))
            assert (await f.task(waiting.id)).aigc == "studio"
            async with httpx.AsyncClient(base_url=origin(f)) as http:
                full = await http.post(
                    "/api/v2/jobs",
                    json={"workflow": GRAPH},
                    headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "k-full"},
                )
            assert full.status_code == 429 and full.headers["Retry-After"] == "2"
            assert full.json()["error"]["code"] == "queue_full"
            later = asyncio.create_task(sdk.submit(Workflow(invert_graph("later"))))
            await asyncio.sleep(0.5)
            assert not later.done()  # waiting out Retry-After
            await waiting.cancel()
            job = await asyncio.wait_for(later, 10)
            assert job.status == "queued"
            async with httpx.AsyncClient(base_url=origin(f)) as http:
                again = await http.post(  # a refused key is free again, as the proxy's
                    "/api/v2/jobs",
                    json={"workflow": GRAPH},
                    headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "k-full"},
                )
            assert again.status_code in (201, 429), again.text
            await running.cancel()
            await job.wait(timeout=15)


async def test_any_serve_process_of_the_fleet_answers_for_a_job(
    gpu: Fleet, redis: aioredis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second serve process on the same Redis, no bridge of its own: a job submitted
    there runs on the first one's bridge, its events (progress too) and its cancel work
    from there."""
    other = ServeProcess(gpu.service.rt.settings, PlatformConfig.load(tmp_path), redis)
    async with serve_app(other.app) as base:
        monkeypatch.setenv("COMFY_BASE_URL", base)
        token = issue_client_token(SECRET, "v2-user")
        async with AsyncComfy(api_key=token, timeout=15.0) as sdk:
            job = await sdk.submit(Workflow(invert_graph("two")))
            seen = [event async for event in job.events()]
            assert isinstance(seen[-1], StatusChange) and seen[-1].status == "succeeded"
            assert any(type(e).__name__ == "Progress" for e in seen[:-1])
            await job.refresh()
            [out] = job.outputs
            assert read_png(await out.to_bytes())[:2] == (64, 48)
            running = await sdk.submit(Workflow(invert_graph("two-b")))
            await until(lambda: _running(gpu.comfy[0]), lambda p: p == running.id, within=10)
            await running.cancel()
            assert running.status == "canceled"
            entry = await until(lambda: _history(gpu.comfy[0], running.id), bool, within=10)
            assert entry["status"]["messages"][-1][0] == "execution_interrupted"
