"""Comfy API v2 uploaded inputs, driven by the unchanged ``comfy-sdk``: an image uploaded
with ``client.assets``, a graph whose ``LoadImage`` names it, the bridge that runs the job
fetching it from aigcq and uploading it to its ComfyUI (the emulator's ``/upload/image``);
the by-hash probe and ``from-hash`` that upload nothing twice; refusals that change nothing."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import blake3
import httpx
import pytest
import redis.asyncio as aioredis
from comfy_sdk import AsyncComfy
from comfy_sdk.exceptions import ComfyError, HashMismatch, MissingAsset, NotFound
from comfy_sdk.workflows import Workflow

from aigcq.config import PlatformConfig
from aigcq.emulators.png import tiny_png
from aigcq.plumbing.auth import issue_client_token
from aigcq.serve.server import ServeProcess
from tests.fakes.comfy_v2 import base as origin
from tests.fakes.comfy_v2 import official_client
from tests.fakes.comfyui import read_png
from tests.fakes.fleet import BRIDGE_TOKEN, SECRET, Fleet, fleet
from tests.fakes.servers import serve_app

LIMIT = 4096


def _load_graph(image: Any, prefix: str) -> dict[str, Any]:
    """LoadImage(image) → ImageInvert → SaveImage."""
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": image}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": prefix}},
    }


@pytest.fixture
async def gpu(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Fleet]:
    async with fleet(
        tmp_path,
        redis,
        redis_url,
        [1],
        paid=0,
        projects=("aigcq",),
        comfy_v2_max_upload_bytes=LIMIT,
        data_dir=tmp_path / "serve",  # its storage: <data_dir>/files
    ) as f:
        yield f


@pytest.fixture
async def sdk(gpu: Fleet, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[AsyncComfy]:
    async with official_client(gpu, monkeypatch) as c:
        yield c


def _token(sub: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {issue_client_token(SECRET, sub)}"}


async def _asset_keys(gpu: Fleet) -> list[bytes]:
    prefix = gpu.service.rt.store.keys.prefix
    return [
        k
        async for k in gpu.service.rt.redis.scan_iter(match=f"{prefix}:v2:*")
        if b":v2:idem:" not in k
    ]


def _stored(gpu: Fleet) -> list[Path]:
    folder = gpu.service.rt.platforms.storage.path_of("inputs")  # type: ignore[union-attr]
    return sorted(folder.iterdir()) if folder.is_dir() else []


async def test_an_uploaded_image_reaches_the_comfyui_that_runs_the_job(
    gpu: Fleet, sdk: AsyncComfy
) -> None:
    png = tiny_png((10, 20, 30), size=6)
    image = sdk.assets.from_bytes(png, filename="photo.png")
    job = await sdk.submit(Workflow(_load_graph(image, "up")))
    assert image.id is not None and image.created_new is True
    assert image.hash == f"blake3:{blake3.blake3(png).hexdigest()}"
    await job.result()
    assert job.status == "succeeded"
    [out] = job.outputs
    assert read_png(await out.to_bytes()) == (6, 6, bytes([245, 235, 225]))  # inverted
    produced = await sdk.assets.get(out.id)  # an output is an asset too
    assert (produced.job_id, produced.file_path) == (job.id, out.name)
    assert produced.hash == job._model.outputs[0].hash
    emulator = gpu.comfy[0]
    [name] = emulator.uploads  # the bridge put it on that ComfyUI, under its hash
    assert name.startswith("aigcq_") and name.endswith(".png")
    folder = emulator.config.directory("input")
    assert folder is not None and (folder / name).read_bytes() == png
    task = await gpu.task(job.id)  # the graph keeps its reference, completed by aigcq
    assert task.payload["workflow"]["1"]["inputs"]["image"] == {
        "__type": "core/ASSET",
        "info": {"id": image.id, "hash": image.hash, "file_path": "photo.png"},
    }
    assert [p.name for p in _stored(gpu)] == [image.hash.removeprefix("blake3:")]

    # the same bytes again: HEAD by-hash hits, from-hash answers the same asset, no upload
    again = sdk.assets.from_bytes(png, filename="again.png")
    assert await again.commit() == image.id
    assert again.created_new is False
    second = await sdk.submit(Workflow(_load_graph(again, "up2")))
    await second.result()
    assert second.status == "succeeded"
    assert len(_stored(gpu)) == 1
    assert emulator.uploads == [name]  # that ComfyUI has it: not uploaded for every task
    fetched = await sdk.assets.get(image.id)  # GET /assets/{id}
    assert (fetched.hash, fetched.file_path) == (image.hash, "photo.png")
    url = await image.get_download_url()  # GET /assets/{id}/content, self-hosted: itself
    assert url.url.endswith(f"/api/v2/assets/{image.id}/content")
    async with httpx.AsyncClient() as http:
        got = await http.get(url.url, headers=_token("v2-user"))
        assert got.content == png
        part = await http.get(url.url, headers={**_token("v2-user"), "Range": "bytes=0-3"})
        assert (part.status_code, part.content) == (206, png[:4])


async def test_by_hash_is_per_caller_and_from_hash_needs_the_callers_bytes(
    gpu: Fleet, sdk: AsyncComfy
) -> None:
    png = tiny_png((1, 2, 3))
    digest = f"blake3:{blake3.blake3(png).hexdigest()}"
    base = f"{origin(gpu)}/api/v2/assets"
    async with httpx.AsyncClient() as http:
        assert (
            await http.head(f"{base}/by-hash/{digest}", headers=_token("v2-user"))
        ).status_code == 404
        miss = await http.post(
            f"{base}/from-hash", json={"hash": digest}, headers=_token("v2-user")
        )
        assert miss.status_code == 404 and miss.json()["error"]["code"] == "blob_not_found"
        huge = await http.post(  # its body is a hash and a name: read bounded
            f"{base}/from-hash", content=b'{"hash": "' + b"x" * 100_000 + b'"}',
            headers=_token("v2-user"),
        )  # fmt: skip
        assert huge.status_code == 413, huge.text
        asset = sdk.assets.from_bytes(png, filename="x.png")
        await asset.commit()
        assert (
            await http.head(f"{base}/by-hash/{digest}", headers=_token("v2-user"))
        ).status_code == 200
        # another caller learns nothing of these bytes, and cannot name that asset
        assert (
            await http.head(f"{base}/by-hash/{digest}", headers=_token("other"))
        ).status_code == 404
        other = await http.post(f"{base}/from-hash", json={"hash": digest}, headers=_token("other"))
        assert other.json()["error"]["code"] == "blob_not_found"
        assert (await http.get(f"{base}/{asset.id}", headers=_token("other"))).status_code == 404
        refused = await http.post(
            f"{origin(gpu)}/api/v2/jobs",
            json={"workflow": _load_graph(await asset.as_reference(), "o")},
            headers=_token("other"),
        )
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "missing_asset"
        assert (
            await http.head(f"{base}/by-hash/blake3:xyz", headers=_token("v2-user"))
        ).status_code == 400
        # bridges fetch inputs with their token, nobody else
        inputs = f"{origin(gpu)}/api/inputs/{digest}"
        assert (await http.get(inputs, headers=_token("v2-user"))).status_code == 401
        bridge = {"Authorization": f"Bearer {BRIDGE_TOKEN}"}
        assert (await http.get(inputs, headers=bridge)).content == png
        # the storage's own /files never serves them
        name = digest.removeprefix("blake3:")
        assert (await http.get(f"{origin(gpu)}/files/inputs/{name}")).status_code == 404
    asset_id = asset.id or ""
    await asset.delete()  # DELETE /assets/{id}: the record goes
    with pytest.raises(NotFound):
        await sdk.assets.get(asset_id)


async def test_a_graph_naming_no_asset_of_the_callers_is_refused(
    gpu: Fleet, sdk: AsyncComfy
) -> None:
    missing = str(uuid.uuid4())
    ref = {"__type": "core/ASSET", "info": {"id": missing}}
    key = f"k-{uuid.uuid4()}"
    with pytest.raises(MissingAsset) as refused:
        await sdk.submit(Workflow(_load_graph(ref, "m")), idempotency_key=key)
    assert refused.value.details == {"missing_ids": [missing]}
    with pytest.raises(MissingAsset):
        await sdk.submit(Workflow(_load_graph({"__type": "core/ASSET"}, "m")))
    asset = sdk.assets.from_bytes(tiny_png((9, 9, 9)), filename="ok.png")
    job = await sdk.submit(Workflow(_load_graph(asset, "m")), idempotency_key=key)  # key free
    await job.wait(timeout=15)
    assert job.status == "succeeded"


async def test_oversized_and_malformed_uploads_are_refused_changing_nothing(
    gpu: Fleet, sdk: AsyncComfy
) -> None:
    big = sdk.assets.from_bytes(b"x" * (LIMIT + 1), filename="big.png")
    with pytest.raises(ComfyError) as too_large:
        await big.commit()
    assert (too_large.value.http_status, too_large.value.code) == (413, "payload_too_large")
    assert too_large.value.details == {"max_bytes": LIMIT}
    url = f"{origin(gpu)}/api/v2/assets"
    data = tiny_png((4, 5, 6))
    async with httpx.AsyncClient() as http:
        huge = await http.post(
            url, files={"file": ("h.png", b"y" * (LIMIT + 70_000))}, headers=_token("v2-user")
        )
        assert huge.status_code == 413  # refused by its Content-Length, nothing read
        cases: list[tuple[dict[str, Any], int]] = [
            ({"content": b"{}", "headers": {"Content-Type": "application/json"}}, 400),
            (
                {
                    "content": b"--b\r\nnot a part",
                    "headers": {"Content-Type": "multipart/form-data; boundary=b"},
                },
                400,
            ),
            ({"data": {"file_path": "a.png"}, "files": {"other": ("a.png", data)}}, 400),
            ({"files": {"file": ("a.png", data)}}, 422),  # no file_path
            ({"data": {"file_path": "../a.png"}, "files": {"file": ("a.png", data)}}, 422),
        ]
        for request, status in cases:
            headers = {**request.pop("headers", {}), **_token("v2-user")}
            answer = await http.post(url, headers=headers, **request)
            assert answer.status_code == status, (request, answer.text)
            assert set(answer.json()["error"]) >= {"code", "message"}
        assert (await http.post(url, files={"file": ("a.png", data)})).status_code == 401
    with pytest.raises(HashMismatch):  # the SDK's expected_hash, not the bytes'
        wrong = sdk.assets.from_bytes(data, filename="w.png")
        wrong._hash = f"blake3:{'0' * 64}"
        await wrong.commit()
    assert await _asset_keys(gpu) == [] and _stored(gpu) == []


async def test_an_input_uploaded_to_another_serve_process_reaches_the_bridge(
    gpu: Fleet, redis: aioredis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two serve processes on one Redis and one storage folder: the upload and the job go to
    the one without a bridge; the bridge of the other fetches the input from its own."""
    other = ServeProcess(gpu.service.rt.settings, PlatformConfig.load(tmp_path), redis)
    async with serve_app(other.app) as base:
        monkeypatch.setenv("COMFY_BASE_URL", base)
        async with AsyncComfy(api_key=issue_client_token(SECRET, "v2-user"), timeout=15) as sdk:
            png = tiny_png((200, 100, 0), size=4)
            job = await sdk.submit(Workflow(_load_graph(sdk.assets.from_bytes(png), "two")))
            await job.result()
            [out] = job.outputs
            assert read_png(await out.to_bytes()) == (4, 4, bytes([55, 155, 255]))


async def test_uploaded_files_go_when_no_asset_named_them_for_a_retention(
    gpu: Fleet, sdk: AsyncComfy
) -> None:
    assets = gpu.service.comfy_v2.assets
    kept = sdk.assets.from_bytes(tiny_png((1, 1, 1)), filename="kept.png")
    gone = sdk.assets.from_bytes(tiny_png((2, 2, 2)), filename="gone.png")
    await kept.commit()
    await gone.commit()
    assert len(_stored(gpu)) == 2
    old = 0.0  # both files last written long ago
    for path in _stored(gpu):
        os.utime(path, (old, old))
    assert await assets.sweep() == 0  # both still named by an asset
    await gpu.service.rt.redis.delete(assets._blob_key(gone.hash.removeprefix("blake3:")))
    assert await assets.sweep() == 1
    assert [p.name for p in _stored(gpu)] == [kept.hash.removeprefix("blake3:")]


async def test_an_input_whose_bytes_are_gone_fails_its_job_as_the_clients_not_the_gpus(
    gpu: Fleet, sdk: AsyncComfy
) -> None:
    """The asset's record is there but its bytes went (a storage lifecycle rule, a sweep
    racing the job): the bridge fetches it, aigcq answers 404, and the job fails
    ``MissingAsset`` at once: not retried as a machine's failure, no GPU blamed."""
    image = sdk.assets.from_bytes(tiny_png((1, 2, 3)), filename="gone.png")
    await image.commit()
    for path in _stored(gpu):
        path.unlink()
    job = await sdk.submit(Workflow(_load_graph(image, "gone")))
    await job.wait(timeout=20)
    assert job.status == "failed"
    assert job.error is not None and "MissingAsset" in f"{job.error.code} {job.error.message}"
    task = await gpu.task(job.id)
    assert task.attempt == 1  # failed for good, not sent again
    assert gpu.comfy[0].uploads == []
    # the by-hash probe no longer says it has them: the SDK uploads the bytes again
    again = sdk.assets.from_bytes(tiny_png((1, 2, 3)), filename="gone.png")
    await again.commit()
    assert again.created_new is False and again.id == image.id  # the same asset
    assert len(_stored(gpu)) == 1
    job = await sdk.submit(Workflow(_load_graph(again, "back")))
    await job.wait(timeout=20)
    assert job.status == "succeeded"
