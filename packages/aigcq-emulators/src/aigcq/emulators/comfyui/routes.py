"""ComfyUI's HTTP and WebSocket API over one :class:`ComfyUIEmulator` (also under ``/api/``),
plus the emulator's own controls (``/emulator/fail``, ``/emulator/restart``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import FileResponse, JSONResponse, Response

from aigcq.emulators.comfyui.config import ComfyUIConfig
from aigcq.emulators.comfyui.executor import ComfyUIEmulator
from aigcq.emulators.comfyui.graph import PromptRejected
from aigcq.plumbing.multipart import MalformedMultipart, parse

log = logging.getLogger(__name__)


def _ram() -> tuple[int, int]:
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0, 0


def _system_stats(config: ComfyUIConfig) -> dict[str, Any]:
    """As ComfyUI's ``server.py`` answers it: the machine, and the torch device in use."""
    total, free = _ram()
    gpu = config.vram_total > 0
    return {
        "system": {
            "os": os.name,
            "ram_total": total,
            "ram_free": free,
            "comfyui_version": "emulator",
            "python_version": sys.version,
            "pytorch_version": "none",
            "embedded_python": False,
            "argv": sys.argv,
        },
        "devices": [
            {
                "name": config.device,
                "type": "cuda" if gpu else "cpu",
                "index": 0 if gpu else None,
                "vram_total": config.vram_total,
                "vram_free": config.vram_free,
                "torch_vram_total": config.vram_total,
                "torch_vram_free": config.vram_free,
            }
        ],
    }


async def _json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object, or ``{}`` for an empty or non-object body."""
    raw = await request.body()
    if not raw.strip():
        return {}
    body = json.loads(raw)
    return body if isinstance(body, dict) else {}


def _view(config: ComfyUIConfig, filename: str, subfolder: str, kind: str) -> Response:
    if not filename or filename.startswith("/") or ".." in filename:
        return Response(status_code=400)
    root = config.directory(kind)
    if root is None:
        return Response(status_code=400)
    folder = (root / subfolder).resolve()
    if not folder.is_relative_to(root.resolve()):
        return Response(status_code=403)
    path = folder / filename
    if not path.is_file():
        return Response(status_code=404)
    headers = {"Content-Disposition": f'filename="{filename}"'}
    return FileResponse(path, headers=headers)


def _router(emu: ComfyUIEmulator) -> APIRouter:
    r = APIRouter()
    for add_routes in (
        _prompt_routes,
        _history_routes,
        _queue_routes,
        _info_routes,
        _upload_routes,
        _control_routes,
        _socket_route,
    ):
        add_routes(r, emu)
    return r


def _prompt_routes(r: APIRouter, emu: ComfyUIEmulator) -> None:
    """``/prompt``: submit a prompt, or read how many are left."""

    @r.post("/prompt")
    async def post_prompt(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return Response("Invalid JSON", status_code=500)
        try:
            return JSONResponse(await emu.submit(body if isinstance(body, dict) else {}))
        except PromptRejected as e:
            return JSONResponse(e.body, status_code=400)

    @r.get("/prompt")
    async def get_prompt() -> dict[str, Any]:
        return {"exec_info": {"queue_remaining": emu.queue_remaining()}}


def _history_routes(r: APIRouter, emu: ComfyUIEmulator) -> None:
    """``/history``: read, clear or delete finished prompts."""

    @r.get("/history")
    async def get_history(max_items: int | None = None) -> dict[str, Any]:
        items = list(emu.history.items())
        return dict(items[-max_items:] if max_items else items)

    @r.get("/history/{prompt_id}")
    async def get_history_item(prompt_id: str) -> dict[str, Any]:
        if emu.config.history_latency > 0:
            await asyncio.sleep(emu.config.history_latency)
        entry = emu.history.get(prompt_id)
        return {prompt_id: entry} if entry is not None else {}

    @r.post("/history")
    async def post_history(request: Request) -> Response:
        body = await _json_body(request)
        emu.history_posts += 1
        if body.get("clear"):
            emu.history.clear()
        for pid in body.get("delete") or []:
            emu.history.pop(str(pid), None)
        return Response(status_code=200)


def _queue_routes(r: APIRouter, emu: ComfyUIEmulator) -> None:
    """``/queue`` and ``/interrupt``: what runs and waits, and taking prompts off."""

    @r.get("/queue")
    async def get_queue() -> dict[str, Any]:
        running = [emu.running.as_list()] if emu.running else []
        return {"queue_running": running, "queue_pending": [i.as_list() for i in emu.pending]}

    @r.post("/queue")
    async def post_queue(request: Request) -> Response:
        body = await _json_body(request)
        if body.get("clear"):
            await emu.delete_pending(None)
        elif body.get("delete"):
            await emu.delete_pending([str(p) for p in body["delete"]])
        return Response(status_code=200)

    @r.post("/interrupt")
    async def post_interrupt(request: Request) -> Response:
        body = await _json_body(request)
        emu.interrupt(str(body["prompt_id"]) if body.get("prompt_id") else None)
        return Response(status_code=200)

    @r.post("/jobs/{prompt_id}/cancel")
    async def cancel_job(prompt_id: str) -> Response:
        """ComfyUI core's per-id cancel (newer than v0.8, which answers 405; served at
        ``/api/jobs/{id}/cancel``, what comfy-api-proxy calls): interrupt the prompt if it
        runs, take it off the queue if it waits; 404 for a prompt neither holds."""
        if emu.running is not None and emu.running.prompt_id == prompt_id:
            emu.interrupt(prompt_id)
            return JSONResponse({"id": prompt_id, "status": "interrupting"})
        if any(i.prompt_id == prompt_id for i in emu.pending):
            await emu.delete_pending([prompt_id])
            return JSONResponse({"id": prompt_id, "status": "cancelled"})
        return JSONResponse({"error": f"no running or pending job {prompt_id}"}, 404)


def _info_routes(r: APIRouter, emu: ComfyUIEmulator) -> None:
    """``/system_stats``, ``/object_info`` and ``/view``: the machine, its nodes, its files."""

    @r.get("/system_stats")
    async def system_stats() -> dict[str, Any]:
        return _system_stats(emu.config)

    @r.get("/object_info")
    async def object_info() -> dict[str, Any]:
        return {name: node.object_info() for name, node in emu.nodes.items()}

    @r.get("/object_info/{node_class}")
    async def object_info_one(node_class: str) -> dict[str, Any]:
        node = emu.nodes.get(node_class)
        return {node_class: node.object_info()} if node else {}

    @r.get("/view")
    async def view(filename: str = "", subfolder: str = "", type: str = "output") -> Response:
        if emu.config.view_latency > 0:
            await asyncio.sleep(emu.config.view_latency)
        return _view(emu.config, filename, subfolder, type)


def _upload_routes(r: APIRouter, emu: ComfyUIEmulator) -> None:
    """``/upload/image``: a multipart ``image`` into the input (or temp, output) folder, as
    ComfyUI's: the same name with other bytes is renamed ``name (1).ext`` unless
    ``overwrite`` is true; the answer names the file."""

    @r.post("/upload/image")
    async def upload_image(request: Request) -> Response:
        try:
            parts = parse(await request.body(), request.headers.get("content-type", ""))
        except MalformedMultipart:
            return Response(status_code=400)
        fields = {p.name: p for p in parts}
        image = fields.get("image")
        if image is None or not image.filename:
            return Response(status_code=400)
        kind = fields["type"].text() if "type" in fields else "input"
        subfolder = fields["subfolder"].text() if "subfolder" in fields else ""
        overwrite = "overwrite" in fields and fields["overwrite"].text().lower() in ("true", "1")
        root = emu.config.directory(kind)
        if root is None:
            return Response(status_code=400)
        folder = (root / subfolder).resolve()
        name = os.path.basename(image.filename)
        if not folder.is_relative_to(root.resolve()) or not name:
            return Response(status_code=403)
        folder.mkdir(parents=True, exist_ok=True)
        stem, ext = os.path.splitext(name)
        i = 0
        while not overwrite and (folder / name).is_file():
            if (folder / name).read_bytes() == image.data:
                break
            i += 1
            name = f"{stem} ({i}){ext}"
        (folder / name).write_bytes(image.data)
        emu.uploads.append(name)
        return JSONResponse({"name": name, "subfolder": subfolder, "type": kind})


def _control_routes(r: APIRouter, emu: ComfyUIEmulator) -> None:
    """The emulator's own controls under ``/emulator/`` (not ComfyUI's API)."""

    @r.post("/emulator/fail")
    async def inject_failures(request: Request) -> dict[str, Any]:
        body = await _json_body(request)
        emu.config.fail_next = int(body.get("next", emu.config.fail_next))
        emu.config.fail_rate = float(body.get("rate", emu.config.fail_rate))
        return {"next": emu.config.fail_next, "rate": emu.config.fail_rate}

    @r.get("/emulator/stats")
    async def stats(spans: bool = False) -> dict[str, Any]:
        """GPU time; with ``?spans=true`` also when each prompt ran (``busySpans``: [start,
        end] wall-clock seconds, ``runningSince``: the running prompt's start or null)."""
        gpu = emu.config.gpu
        found: dict[str, Any] = {
            "loaded": gpu.loaded,
            "loads": gpu.loads,
            "loadingS": gpu.loading_s,
            "busyS": gpu.busy_s,
            "historyPosts": emu.history_posts,
        }
        if spans:
            found["busySpans"] = [list(s) for s in gpu.spans]
            found["runningSince"] = gpu.running_since
        return found

    @r.post("/emulator/restart")
    async def restart() -> dict[str, Any]:
        await emu.restart()
        return {"restarted": True}


def _socket_route(r: APIRouter, emu: ComfyUIEmulator) -> None:
    """``/ws``: one socket per ``clientId`` (a new one replaces the old; see
    ``forget_client_on_close``), sent a status."""

    @r.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        sid = websocket.query_params.get("clientId") or uuid.uuid4().hex
        await websocket.accept()
        old = emu.sockets.get(sid)
        emu.sockets[sid] = websocket
        if old is not None and not emu.config.forget_client_on_close:
            with contextlib.suppress(Exception):
                await old.close()
        await websocket.send_json({"type": "status", "data": {**emu.status(), "sid": sid}})
        try:
            while True:
                await websocket.receive_text()
        except WebSocketDisconnect:
            pass
        finally:
            if emu.sockets.get(sid) is websocket or emu.config.forget_client_on_close:
                emu.sockets.pop(sid, None)


def create_app(config: ComfyUIConfig | None = None) -> FastAPI:
    """The emulator as an ASGI app; its state is ``app.state.emulator``."""
    emu = ComfyUIEmulator(config or ComfyUIConfig())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        emu.config.output_dir.mkdir(parents=True, exist_ok=True)
        worker = asyncio.create_task(emu.worker(), name="comfyui-emulator-worker")
        try:
            yield
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    app = FastAPI(title="ComfyUI emulator", lifespan=lifespan)
    app.state.emulator = emu
    router = _router(emu)
    app.include_router(router)
    app.include_router(router, prefix="/api")
    return app
