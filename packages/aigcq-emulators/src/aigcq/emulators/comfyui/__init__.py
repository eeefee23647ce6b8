"""A ComfyUI emulator: a real HTTP + WebSocket server following ComfyUI's API.

Implements ``/prompt`` (with ComfyUI's validation errors), ``/history``, ``/view``,
``/queue``, ``/interrupt``, ``/system_stats``, ``/object_info`` and ``/ws`` — each also under
``/api/`` — for the weight-free nodes ``EmptyImage``, ``ImageInvert``, ``SaveImage`` and
``PreviewImage``. Prompts run one at a time; every executed node takes ``steps`` steps of
``step_time`` seconds (one ``progress`` event each, and a ``progress_state`` at each
node's start, step and end, as ComfyUI 0.3.4x and newer send). Images are real PNG files written
without Pillow. Failures are injected by ``fail_rate`` or ``fail_next`` (also settable at
run time with ``POST /emulator/fail {"next": n, "rate": r}``). ``POST /emulator/restart``
acts as a ComfyUI process that restarted: its queue, history and running prompt are
forgotten. ``POST /queue {"delete": [...]}`` deletes pending prompts, as ComfyUI's UI does.
``POST /interrupt`` stops the running prompt after ``interrupt_latency`` seconds (real
ComfyUI takes about one on a GPU; default 0, at the next step), in ``/queue`` until then;
with ``global_interrupt`` it ignores the body's ``prompt_id``, as ComfyUI before 0.3.56.
``POST /api/jobs/{id}/cancel`` interrupts that prompt if it runs and takes it off the queue
if it waits, as newer ComfyUI core does (what ``comfy-api-proxy`` calls for a cancel).
``view_latency`` and ``history_latency`` delay ``GET /view`` and ``GET /history/{id}`` (a
slow link, a loaded ComfyUI) while the worker goes on with the next prompt.

Events go to the socket whose ``clientId`` is the prompt's ``client_id``; ``status`` is
broadcast. As in ComfyUI, a prompt without ``client_id`` has its ``executing``/``progress``/
``executed`` broadcast and its ``execution_*`` events sent to no one, except
``execution_interrupted`` (broadcast).

Output nodes are never served from the cache, so every run writes files (real ComfyUI 0.3.64
wrote ``x_00002_.png`` for an identical prompt too).

Modules: :mod:`.config`, :mod:`.png` (images), :mod:`.nodes`, :mod:`.graph` (validation,
dependencies), :mod:`.executor` (queue, history, worker), :mod:`.routes` (HTTP + WebSocket).
"""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from aigcq.emulators.comfyui.config import ComfyUIConfig
from aigcq.emulators.comfyui.executor import ComfyUIEmulator
from aigcq.emulators.comfyui.routes import create_app

__all__ = ["ComfyUIConfig", "ComfyUIEmulator", "create_app", "run", "serve"]

log = logging.getLogger(__name__)


async def serve(
    host: str, port: int, config: ComfyUIConfig | None = None, v2_port: int = 0
) -> None:
    """Serve the emulator until cancelled; with ``v2_port``, Comfy API v2 in front of it
    too: the real ``comfy-api-proxy`` (a package of its own) on that port."""
    server_config = uvicorn.Config(create_app(config), host=host, port=port, log_config=None)
    log.info("comfyui emulator listening on http://%s:%s", host, port)
    if not v2_port:
        await uvicorn.Server(server_config).serve()
        return
    from aiohttp import web
    from comfy_api_proxy.app import make_app

    runner = web.AppRunner(make_app(f"http://{host}:{port}"))
    await runner.setup()
    await web.TCPSite(runner, host, v2_port).start()
    log.info("comfy-api-proxy (Comfy API v2) listening on http://%s:%s", host, v2_port)
    try:
        await uvicorn.Server(server_config).serve()
    finally:
        await runner.cleanup()


def run(
    host: str = "127.0.0.1", port: int = 8188, config: ComfyUIConfig | None = None, v2_port: int = 0
) -> None:
    """Blocking entry point for ``aigcq emulate comfyui``."""
    asyncio.run(serve(host, port, config, v2_port))
