"""A ComfyUI emulator: a real HTTP + WebSocket server following ComfyUI's API.

Implements ``/prompt`` (with ComfyUI's validation errors), ``/history``, ``/view``,
``/queue``, ``/interrupt``, ``/system_stats``, ``/object_info`` and ``/ws`` — each also under
``/api/`` — for the weight-free nodes ``EmptyImage``, ``ImageInvert``, ``SaveImage`` and
``PreviewImage``. Prompts run one at a time; every executed node takes ``steps`` steps of
``step_time`` seconds (one ``progress`` event each). Images are real PNG files written
without Pillow. Failures are injected by ``fail_rate`` or ``fail_next`` (also settable at
run time with ``POST /emulator/fail {"next": n, "rate": r}``).

Events go to the socket whose ``clientId`` is the prompt's ``client_id``; ``status`` is
broadcast. As in ComfyUI, a prompt without ``client_id`` has its ``executing``/``progress``/
``executed`` broadcast and its ``execution_*`` events sent to no one, except
``execution_interrupted`` (broadcast).

Simplification: output nodes are never served from the cache, so every run writes files.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import os
import random
import re
import string
import struct
import sys
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import APIRouter, FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import FileResponse, JSONResponse, Response

log = logging.getLogger(__name__)

HISTORY_LIMIT = 10000


@dataclass
class ComfyUIConfig:
    """Emulator settings; ``fail_next`` and ``fail_rate`` may be changed while running."""

    output_dir: Path = Path(".aigcq/comfyui/output")
    input_dir: Path | None = None  # default: ``output_dir/../input``
    temp_dir: Path | None = None  # default: ``output_dir/../temp``
    step_time: float = 0.05
    steps: int = 4
    fail_rate: float = 0.0
    fail_next: int = 0
    seed: int | None = None

    def directory(self, kind: str) -> Path | None:
        """The folder for a ``/view`` ``type`` (output, input, temp)."""
        base = self.output_dir.parent
        dirs = {
            "output": self.output_dir,
            "input": self.input_dir or base / "input",
            "temp": self.temp_dir or base / "temp",
        }
        return dirs.get(kind)


# ---- images and PNG --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Image:
    """An 8-bit RGB image."""

    width: int
    height: int
    rgb: bytes


_INVERT = bytes(255 - i for i in range(256))


def solid_image(width: int, height: int, color: int) -> Image:
    pixel = bytes(((color >> 16) & 255, (color >> 8) & 255, color & 255))
    return Image(width, height, pixel * (width * height))


def invert_image(img: Image) -> Image:
    return Image(img.width, img.height, img.rgb.translate(_INVERT))


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def encode_png(img: Image, text: dict[str, str] | None = None) -> bytes:
    """A PNG (colour type 2, no filtering), with optional ``tEXt`` chunks as ComfyUI adds."""
    stride = img.width * 3
    raw = b"".join(b"\x00" + img.rgb[y * stride : (y + 1) * stride] for y in range(img.height))
    header = struct.pack(">IIBBBBB", img.width, img.height, 8, 2, 0, 0, 0)
    texts = b"".join(
        _chunk(b"tEXt", k.encode("latin-1") + b"\x00" + v.encode("latin-1", "replace"))
        for k, v in (text or {}).items()
    )
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + texts
        + _chunk(b"IDAT", zlib.compress(raw, 6))
        + _chunk(b"IEND", b"")
    )


# ---- nodes -----------------------------------------------------------------------------


class NodeFailure(Exception):
    """Raised by a node while executing; reported as ``execution_error``."""


@dataclass(frozen=True, slots=True)
class NodeContext:
    config: ComfyUIConfig
    prompt: dict[str, Any]


NodeResult = tuple[tuple[Any, ...], dict[str, Any] | None]


@dataclass(frozen=True)
class NodeDef:
    name: str
    category: str
    required: dict[str, tuple[Any, dict[str, Any]]]
    outputs: tuple[str, ...]
    output_node: bool
    run: Callable[[NodeContext, dict[str, Any]], NodeResult]

    def object_info(self) -> dict[str, Any]:
        return {
            "input": {"required": {k: [t, o] for k, (t, o) in self.required.items()}},
            "input_order": {"required": list(self.required)},
            "output": list(self.outputs),
            "output_is_list": [False] * len(self.outputs),
            "output_name": list(self.outputs),
            "name": self.name,
            "display_name": self.name,
            "description": "",
            "python_module": "nodes",
            "category": self.category,
            "output_node": self.output_node,
        }


def _save_images(ctx: NodeContext, images: list[Image], prefix: str, kind: str) -> dict[str, Any]:
    """Write ``<prefix>_<counter:05>_.png`` files as ComfyUI's ``SaveImage`` does."""
    root = ctx.config.directory(kind)
    assert root is not None
    subfolder, name = os.path.split(os.path.normpath(prefix))
    folder = (root / subfolder).resolve()
    if not folder.is_relative_to(root.resolve()):
        raise NodeFailure("Saving image outside the output folder is not allowed.")
    folder.mkdir(parents=True, exist_ok=True)
    pattern = re.compile(re.escape(name) + r"_(\d{5,})_")
    counters = [int(m.group(1)) for p in folder.iterdir() if (m := pattern.match(p.name))]
    counter = max(counters, default=0) + 1
    meta = {"prompt": json.dumps(ctx.prompt)}
    results = []
    for i, img in enumerate(images):
        filename = f"{name}_{counter + i:05}_.png"
        (folder / filename).write_bytes(encode_png(img, meta))
        results.append({"filename": filename, "subfolder": subfolder, "type": kind})
    return {"images": results}


def _empty_image(ctx: NodeContext, inp: dict[str, Any]) -> NodeResult:
    img = solid_image(inp["width"], inp["height"], inp["color"])
    return ([img] * inp["batch_size"],), None


def _image_invert(ctx: NodeContext, inp: dict[str, Any]) -> NodeResult:
    return ([invert_image(i) for i in inp["image"]],), None


def _save_image(ctx: NodeContext, inp: dict[str, Any]) -> NodeResult:
    return (), _save_images(ctx, inp["images"], inp["filename_prefix"], "output")


def _preview_image(ctx: NodeContext, inp: dict[str, Any]) -> NodeResult:
    suffix = "".join(random.choices(string.ascii_lowercase, k=5))
    return (), _save_images(ctx, inp["images"], f"ComfyUI_temp_{suffix}", "temp")


def _int(default: int, lo: int, hi: int, **extra: Any) -> tuple[str, dict[str, Any]]:
    return "INT", {"default": default, "min": lo, "max": hi, "step": 1, **extra}


_SIZE = _int(512, 1, 16384)
NODES: dict[str, NodeDef] = {
    n.name: n
    for n in (
        NodeDef(
            "EmptyImage",
            "image",
            {
                "width": _SIZE,
                "height": _SIZE,
                "batch_size": _int(1, 1, 4096),
                "color": _int(0, 0, 0xFFFFFF, display="color"),
            },
            ("IMAGE",),
            False,
            _empty_image,
        ),
        NodeDef("ImageInvert", "image", {"image": ("IMAGE", {})}, ("IMAGE",), False, _image_invert),
        NodeDef(
            "SaveImage",
            "image",
            {"images": ("IMAGE", {}), "filename_prefix": ("STRING", {"default": "ComfyUI"})},
            (),
            True,
            _save_image,
        ),
        NodeDef("PreviewImage", "image", {"images": ("IMAGE", {})}, (), True, _preview_image),
    )
}


# ---- validation ------------------------------------------------------------------------


class PromptRejected(Exception):
    """A 400 answer to ``POST /prompt``."""

    def __init__(self, kind: str, message: str, details: str = "", node_errors: Any = None):
        super().__init__(message)
        self.body = {
            "error": {"type": kind, "message": message, "details": details, "extra_info": {}},
            "node_errors": node_errors or {},
        }


def _input_error(kind: str, message: str, name: str, details: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "message": message,
        "details": details,
        "extra_info": {"input_name": name, **extra},
    }


def _check_value(name: str, spec: tuple[Any, dict[str, Any]], val: Any) -> tuple[Any, list[Any]]:
    """Convert a literal input as ComfyUI does; return (value, errors)."""
    kind, opts = spec
    info = {"input_config": list(spec), "received_value": val}
    if kind == "STRING":
        return str(val), []
    if kind != "INT":
        msg = f"Failed to convert an input value to a {kind} value"
        return val, [_input_error("invalid_input_type", msg, name, f"{name}, {val}", **info)]
    try:
        val = int(val)
    except (TypeError, ValueError) as e:
        msg = f"Failed to convert an input value to a {kind} value"
        details = f"{name}, {val}, {e}"
        return val, [
            _input_error("invalid_input_type", msg, name, details, exception_message=str(e), **info)
        ]
    if val < opts["min"]:
        msg = f"Value {val} smaller than min of {opts['min']}"
        return val, [_input_error("value_smaller_than_min", msg, name, name, **info)]
    if val > opts["max"]:
        msg = f"Value {val} bigger than max of {opts['max']}"
        return val, [_input_error("value_bigger_than_max", msg, name, name, **info)]
    return val, []


@dataclass
class _Validator:
    prompt: dict[str, Any]
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # converted values
    valid: dict[str, bool] = field(default_factory=dict)
    errors: dict[str, list[Any]] = field(default_factory=dict)

    def node(self, node_id: str) -> bool:
        if node_id in self.valid:
            return self.valid[node_id]
        self.valid[node_id] = True  # provisional: breaks link cycles
        node = self.prompt[node_id]
        spec = NODES[node["class_type"]]
        raw = node.get("inputs") or {}
        errors: list[Any] = []
        upstream_ok = True
        converted: dict[str, Any] = {}
        for name, input_spec in spec.required.items():
            if name not in raw:
                msg = "Required input is missing"
                errors.append(_input_error("required_input_missing", msg, name, name))
            elif isinstance(raw[name], list):
                link_errors, ok = self._link(name, input_spec, raw[name])
                errors += link_errors
                upstream_ok &= ok
                converted[name] = raw[name]
            else:
                converted[name], value_errors = _check_value(name, input_spec, raw[name])
                errors += value_errors
        self.inputs[node_id] = converted
        if errors:
            self.errors[node_id] = errors
        self.valid[node_id] = not errors and upstream_ok
        return self.valid[node_id]

    def _link(
        self, name: str, spec: tuple[Any, dict[str, Any]], val: list[Any]
    ) -> tuple[list[Any], bool]:
        info = {"input_config": list(spec), "received_value": val}
        if len(val) != 2 or not isinstance(val[1], int) or str(val[0]) not in self.prompt:
            msg = "Bad linked input, must be a length-2 list of [string, int]"
            return [_input_error("bad_linked_input", msg, name, name, **info)], False
        src = str(val[0])
        outputs = NODES[self.prompt[src]["class_type"]].outputs
        received = outputs[val[1]] if 0 <= val[1] < len(outputs) else None
        if received != spec[0]:
            msg = "Return type mismatch between linked nodes"
            details = f"{name}, received_type({received}) mismatch input_type({spec[0]})"
            err = _input_error("return_type_mismatch", msg, name, details, linked_node=val)
            return [err], False
        return [], self.node(src)


@dataclass(frozen=True)
class ValidPrompt:
    outputs: list[str]
    inputs: dict[str, dict[str, Any]]
    node_errors: dict[str, Any]


def validate_prompt(prompt: Any) -> ValidPrompt:
    """ComfyUI's ``validate_prompt``: raises :class:`PromptRejected` with its error types."""
    if not isinstance(prompt, dict):
        raise PromptRejected("invalid_prompt", "Prompt is not a dict", "")
    for node_id, node in prompt.items():
        if not isinstance(node, dict) or "class_type" not in node:
            msg = "Cannot execute because a node is missing the class_type property."
            raise PromptRejected("invalid_prompt", msg, f"Node ID '#{node_id}'")
        if node["class_type"] not in NODES:
            msg = f"Cannot execute because node {node['class_type']} does not exist."
            raise PromptRejected("invalid_prompt", msg, f"Node ID '#{node_id}'")
    outputs = [i for i, n in prompt.items() if NODES[n["class_type"]].output_node]
    if not outputs:
        raise PromptRejected("prompt_no_outputs", "Prompt has no outputs", "")
    v = _Validator(prompt)
    good = [o for o in outputs if v.node(o)]
    node_errors: dict[str, Any] = {}
    for out in outputs:
        for node_id in _ancestors(prompt, out):
            if node_id in v.errors:
                entry = node_errors.setdefault(
                    node_id,
                    {
                        "errors": v.errors[node_id],
                        "dependent_outputs": [],
                        "class_type": prompt[node_id]["class_type"],
                    },
                )
                entry["dependent_outputs"].append(out)
    if not good:
        details = "\n".join(
            f"{e['message']}: {e['details']}" for n in node_errors.values() for e in n["errors"]
        )
        msg = "Prompt outputs failed validation"
        raise PromptRejected("prompt_outputs_failed_validation", msg, details, node_errors)
    return ValidPrompt(good, v.inputs, node_errors)


def _links(node: dict[str, Any]) -> list[str]:
    return [
        str(v[0])
        for v in (node.get("inputs") or {}).values()
        if isinstance(v, list) and len(v) == 2
    ]


def _ancestors(prompt: dict[str, Any], output: str) -> list[str]:
    """``output`` and every node it depends on, dependencies first (each node once)."""
    order: list[str] = []
    seen: set[str] = set()
    stack: list[tuple[str, bool]] = [(output, False)]
    while stack:
        node_id, expanded = stack.pop()
        if expanded:
            order.append(node_id)
            continue
        if node_id in seen or node_id not in prompt:
            continue
        seen.add(node_id)
        stack.append((node_id, True))
        stack.extend((src, False) for src in reversed(_links(prompt[node_id])))
    return order


def _signature(prompt: dict[str, Any], node_id: str, memo: dict[str, str]) -> str:
    """A cache key: the node's class and inputs, with links replaced by their sources' keys."""
    if node_id not in memo:
        memo[node_id] = ""  # cycle guard
        node = prompt[node_id]
        inputs = {
            k: [_signature(prompt, str(v[0]), memo), v[1]] if isinstance(v, list) else v
            for k, v in sorted((node.get("inputs") or {}).items())
        }
        memo[node_id] = json.dumps([node["class_type"], inputs], sort_keys=True, default=str)
    return memo[node_id]


# ---- the server state and executor -----------------------------------------------------


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(order=True)
class QueueItem:
    number: float
    prompt_id: str = field(compare=False)
    prompt: dict[str, Any] = field(compare=False)
    extra_data: dict[str, Any] = field(compare=False)
    valid: ValidPrompt = field(compare=False)
    interrupted: bool = field(default=False, compare=False)
    forgotten: bool = field(default=False, compare=False)  # its server "restarted"

    @property
    def client_id(self) -> str | None:
        cid = self.extra_data.get("client_id")
        return str(cid) if cid else None

    def as_list(self) -> list[Any]:
        return [self.number, self.prompt_id, self.prompt, self.extra_data, self.valid.outputs]


class Interrupted(Exception):
    pass


class ComfyUIEmulator:
    """Queue, history, sockets and the single worker of one emulated ComfyUI."""

    def __init__(self, config: ComfyUIConfig) -> None:
        self.config = config
        self.pending: list[QueueItem] = []
        self.running: QueueItem | None = None
        self.history: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.sockets: dict[str, WebSocket] = {}
        self._number = 0
        self._wake = asyncio.Event()
        self._cache: dict[str, tuple[Any, ...]] = {}
        self._rng = random.Random(config.seed)

    # -- sockets --
    async def send(self, event: str, data: dict[str, Any], sid: str | None = None) -> None:
        """Send to ``sid``'s socket, or to every socket when ``sid`` is None."""
        targets = [self.sockets[sid]] if sid in self.sockets else []
        if sid is None:
            targets = list(self.sockets.values())
        for ws in targets:
            with contextlib.suppress(Exception):
                await ws.send_json({"type": event, "data": data})

    def queue_remaining(self) -> int:
        return len(self.pending) + (self.running is not None)

    def status(self) -> dict[str, Any]:
        return {"status": {"exec_info": {"queue_remaining": self.queue_remaining()}}}

    async def broadcast_status(self) -> None:
        await self.send("status", self.status())

    # -- queue --
    async def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        if "prompt" not in body:
            raise PromptRejected("no_prompt", "No prompt provided", "No prompt provided")
        valid = validate_prompt(body["prompt"])
        prompt_id = str(body.get("prompt_id") or uuid.uuid4())
        number: float = self._number
        if "number" in body:
            number = float(body["number"])
        elif body.get("front"):
            number = -number
        self._number += 1
        extra = dict(body.get("extra_data") or {})
        if body.get("client_id"):
            extra["client_id"] = body["client_id"]
        extra.setdefault("create_time", _now_ms())
        bisect.insort(self.pending, QueueItem(number, prompt_id, body["prompt"], extra, valid))
        self._wake.set()
        await self.broadcast_status()
        return {"prompt_id": prompt_id, "number": number, "node_errors": valid.node_errors}

    async def delete_pending(self, prompt_ids: list[str] | None) -> None:
        """Drop the given pending prompts (all of them when ``prompt_ids`` is None)."""
        self.pending = [i for i in self.pending if prompt_ids and i.prompt_id not in prompt_ids]
        await self.broadcast_status()

    def interrupt(self, prompt_id: str | None) -> None:
        if self.running and prompt_id in (None, self.running.prompt_id):
            self.running.interrupted = True

    async def restart(self) -> None:
        """As if the ComfyUI process restarted: its queue, history and the running prompt
        are forgotten (no events, no history entry for it)."""
        self.pending = []
        self.history.clear()
        if self.running is not None:
            self.running.interrupted = self.running.forgotten = True
        await self.broadcast_status()

    def _take_failure(self) -> bool:
        if self.config.fail_next > 0:
            self.config.fail_next -= 1
            return True
        return self._rng.random() < self.config.fail_rate

    async def worker(self) -> None:
        """Run queued prompts one at a time, forever."""
        while True:
            if not self.pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            self.running = self.pending.pop(0)
            try:
                await self._run(self.running)
            finally:
                self.running = None
            await self.broadcast_status()

    # -- execution --
    async def _run(self, item: QueueItem) -> None:
        pid, sid = item.prompt_id, item.client_id
        messages: list[list[Any]] = []

        async def event(name: str, data: dict[str, Any], broadcast: bool = False) -> None:
            data = {"prompt_id": pid, **data, "timestamp": _now_ms()}
            messages.append([name, data])
            if sid is not None or broadcast:
                await self.send(name, data, sid)

        order = [n for out in item.valid.outputs for n in _ancestors(item.prompt, out)]
        order = list(dict.fromkeys(order))
        memo: dict[str, str] = {}
        signatures = {n: _signature(item.prompt, n, memo) for n in order}
        cached = [n for n in order if signatures[n] in self._cache]
        await event("execution_start", {})
        await event("execution_cached", {"nodes": cached})
        fail_at = order[-1] if self._take_failure() else None
        results: dict[str, tuple[Any, ...]] = {n: self._cache[signatures[n]] for n in cached}
        ui: dict[str, Any] = {}
        current = ""
        try:
            for current in order:
                if current not in results:
                    results[current] = await self._node(
                        item, current, results, ui, current == fail_at
                    )
        except Interrupted:
            if item.forgotten:
                return
            node_type = item.prompt[current]["class_type"]
            info = {"node_id": current, "node_type": node_type, "executed": list(results)}
            await event("execution_interrupted", info, broadcast=True)
        except Exception as e:
            log.info("comfyui emulator: prompt %s failed at node %s: %s", pid, current, e)
            await event("execution_error", self._error_data(item, current, list(results), e))
        else:
            await event("execution_success", {})
        self._cache = {signatures[n]: results[n] for n in results if results[n]}
        self._record(item, ui, messages)
        await self.send("executing", {"node": None, "prompt_id": pid}, sid)

    async def _node(
        self,
        item: QueueItem,
        node_id: str,
        results: dict[str, tuple[Any, ...]],
        ui: dict[str, Any],
        fail: bool,
    ) -> tuple[Any, ...]:
        pid, sid = item.prompt_id, item.client_id
        await self.send(
            "executing", {"node": node_id, "display_node": node_id, "prompt_id": pid}, sid
        )
        steps = max(self.config.steps, 1)
        for value in range(1, steps + 1):
            await asyncio.sleep(self.config.step_time)
            if item.interrupted:
                raise Interrupted
            progress = {"value": value, "max": steps, "prompt_id": pid, "node": node_id}
            await self.send("progress", progress, sid)
        if fail:
            raise NodeFailure("Injected failure (comfyui emulator)")
        inputs = {
            k: results[str(v[0])][v[1]] if isinstance(v, list) else v
            for k, v in item.valid.inputs[node_id].items()
        }
        spec = NODES[item.prompt[node_id]["class_type"]]
        ctx = NodeContext(self.config, item.prompt)
        outputs, node_ui = await asyncio.to_thread(spec.run, ctx, inputs)
        if node_ui is not None:
            ui[node_id] = node_ui
            executed = {
                "node": node_id,
                "display_node": node_id,
                "output": node_ui,
                "prompt_id": pid,
            }
            await self.send("executed", executed, sid)
        return outputs

    @staticmethod
    def _error_data(
        item: QueueItem, node_id: str, executed: list[str], e: Exception
    ) -> dict[str, Any]:
        return {
            "node_id": node_id,
            "node_type": item.prompt[node_id]["class_type"],
            "executed": executed,
            "exception_message": str(e),
            "exception_type": type(e).__name__,
            "traceback": [f'  File "nodes.py", in {item.prompt[node_id]["class_type"]}\n'],
            "current_inputs": {},
            "current_outputs": {},
        }

    def _record(self, item: QueueItem, ui: dict[str, Any], messages: list[list[Any]]) -> None:
        ok = messages[-1][0] == "execution_success"
        self.history[item.prompt_id] = {
            "prompt": item.as_list(),
            "outputs": ui,
            "status": {
                "status_str": "success" if ok else "error",
                "completed": ok,
                "messages": messages,
            },
            "meta": {
                n: {"node_id": n, "display_node": n, "parent_node": None, "real_node_id": n}
                for n in ui
            },
        }
        while len(self.history) > HISTORY_LIMIT:
            self.history.popitem(last=False)


# ---- HTTP routes -----------------------------------------------------------------------


def _ram() -> tuple[int, int]:
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0, 0


def _system_stats() -> dict[str, Any]:
    total, free = _ram()
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
                "name": "cpu",
                "type": "cpu",
                "index": None,
                "vram_total": 0,
                "vram_free": 0,
                "torch_vram_total": 0,
                "torch_vram_free": 0,
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

    @r.get("/history")
    async def get_history(max_items: int | None = None) -> dict[str, Any]:
        items = list(emu.history.items())
        return dict(items[-max_items:] if max_items else items)

    @r.get("/history/{prompt_id}")
    async def get_history_item(prompt_id: str) -> dict[str, Any]:
        entry = emu.history.get(prompt_id)
        return {prompt_id: entry} if entry is not None else {}

    @r.post("/history")
    async def post_history(request: Request) -> Response:
        body = await _json_body(request)
        if body.get("clear"):
            emu.history.clear()
        for pid in body.get("delete") or []:
            emu.history.pop(str(pid), None)
        return Response(status_code=200)

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

    @r.get("/system_stats")
    async def system_stats() -> dict[str, Any]:
        return _system_stats()

    @r.get("/object_info")
    async def object_info() -> dict[str, Any]:
        return {name: node.object_info() for name, node in NODES.items()}

    @r.get("/object_info/{node_class}")
    async def object_info_one(node_class: str) -> dict[str, Any]:
        node = NODES.get(node_class)
        return {node_class: node.object_info()} if node else {}

    @r.get("/view")
    async def view(filename: str = "", subfolder: str = "", type: str = "output") -> Response:
        return _view(emu.config, filename, subfolder, type)

    @r.post("/emulator/fail")
    async def inject_failures(request: Request) -> dict[str, Any]:
        body = await _json_body(request)
        emu.config.fail_next = int(body.get("next", emu.config.fail_next))
        emu.config.fail_rate = float(body.get("rate", emu.config.fail_rate))
        return {"next": emu.config.fail_next, "rate": emu.config.fail_rate}

    @r.post("/emulator/restart")
    async def restart() -> dict[str, Any]:
        await emu.restart()
        return {"restarted": True}

    @r.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        sid = websocket.query_params.get("clientId") or uuid.uuid4().hex
        await websocket.accept()
        old = emu.sockets.get(sid)
        emu.sockets[sid] = websocket
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close()
        await websocket.send_json({"type": "status", "data": {**emu.status(), "sid": sid}})
        try:
            while True:
                await websocket.receive_text()
        except WebSocketDisconnect:
            pass
        finally:
            if emu.sockets.get(sid) is websocket:
                del emu.sockets[sid]

    return r


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


async def serve(host: str, port: int, config: ComfyUIConfig | None = None) -> None:
    """Serve the emulator until cancelled."""
    server_config = uvicorn.Config(create_app(config), host=host, port=port, log_config=None)
    log.info("comfyui emulator listening on http://%s:%s", host, port)
    await uvicorn.Server(server_config).serve()


def run(host: str = "127.0.0.1", port: int = 8188, config: ComfyUIConfig | None = None) -> None:
    """Blocking entry point for ``aigcq emulate comfyui``."""
    asyncio.run(serve(host, port, config))
