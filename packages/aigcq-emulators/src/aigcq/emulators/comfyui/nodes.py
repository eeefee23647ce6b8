"""The emulated node classes: ``EmptyImage``, ``LoadImage`` (a file of the input folder, as
``/upload/image`` puts there; its ``image`` is a STRING here, checked when it runs, where
ComfyUI lists the folder's files), ``ImageInvert``, ``SaveImage``, ``PreviewImage``,
and a weight-free model path: ``CheckpointLoaderSimple`` (charges the configured load time
when it switches checkpoints), ``EmptyLatentImage``, ``VAEDecode`` (a gray image)."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import string
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aigcq.emulators.comfyui.config import ComfyUIConfig
from aigcq.emulators.png import Image, decode_png, encode_png, invert_image, solid_image

log = logging.getLogger(__name__)


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


def _load_image(ctx: NodeContext, inp: dict[str, Any]) -> NodeResult:
    root = ctx.config.directory("input")
    assert root is not None
    path = (root / inp["image"]).resolve()
    if not path.is_relative_to(root.resolve()) or not path.is_file():
        raise NodeFailure(f"Invalid image file: {inp['image']}")
    img = decode_png(path.read_bytes()) or solid_image(64, 64, 0x808080)
    return ([img], None), None


def _image_invert(ctx: NodeContext, inp: dict[str, Any]) -> NodeResult:
    return ([invert_image(i) for i in inp["image"]],), None


def _save_image(ctx: NodeContext, inp: dict[str, Any]) -> NodeResult:
    return (), _save_images(ctx, inp["images"], inp["filename_prefix"], "output")


def _preview_image(ctx: NodeContext, inp: dict[str, Any]) -> NodeResult:
    suffix = "".join(random.choices(string.ascii_lowercase, k=5))
    return (), _save_images(ctx, inp["images"], f"ComfyUI_temp_{suffix}", "temp")


def _int(default: int, lo: int, hi: int, **extra: Any) -> tuple[str, dict[str, Any]]:
    return "INT", {"default": default, "min": lo, "max": hi, "step": 1, **extra}


def _load_checkpoint(ctx: NodeContext, inp: dict[str, Any]) -> NodeResult:
    gpu, name = ctx.config.gpu, inp["ckpt_name"]
    if gpu.loaded != name:
        time.sleep(ctx.config.model_load_time)  # in a worker thread, as a real load
        gpu.loaded, gpu.loads = name, gpu.loads + 1
        gpu.loading_s += ctx.config.model_load_time
    model = {"ckpt": name}
    return (model, model, model), None


def _empty_latent(ctx: NodeContext, inp: dict[str, Any]) -> NodeResult:
    return ({"width": inp["width"], "height": inp["height"], "batch": inp["batch_size"]},), None


def _vae_decode(ctx: NodeContext, inp: dict[str, Any]) -> NodeResult:
    latent = inp["samples"]
    img = solid_image(latent["width"], latent["height"], 0x808080)
    return ([img] * latent["batch"],), None


def checkpoint_loader(checkpoints: tuple[str, ...]) -> NodeDef:
    """``CheckpointLoaderSimple`` offering ``checkpoints`` (a COMBO input, as in ComfyUI)."""
    required: dict[str, tuple[Any, dict[str, Any]]] = {"ckpt_name": (list(checkpoints), {})}
    outputs = ("MODEL", "CLIP", "VAE")
    return NodeDef("CheckpointLoaderSimple", "loaders", required, outputs, False, _load_checkpoint)


def node_table(
    node_classes: frozenset[str] | None, checkpoints: tuple[str, ...]
) -> dict[str, NodeDef]:
    """The node classes one instance has."""
    table = {**NODES, "CheckpointLoaderSimple": checkpoint_loader(checkpoints)}
    if node_classes is None:
        return table
    return {name: node for name, node in table.items() if name in node_classes}


_SIZE = _int(512, 1, 16384)
_LATENT = _int(512, 16, 16384)
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
        NodeDef(
            "LoadImage",
            "image",
            {"image": ("STRING", {"image_upload": True})},
            ("IMAGE", "MASK"),
            False,
            _load_image,
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
        NodeDef(
            "EmptyLatentImage",
            "latent",
            {"width": _LATENT, "height": _LATENT, "batch_size": _int(1, 1, 4096)},
            ("LATENT",),
            False,
            _empty_latent,
        ),
        NodeDef(
            "VAEDecode",
            "latent",
            {"samples": ("LATENT", {}), "vae": ("VAE", {})},
            ("IMAGE",),
            False,
            _vae_decode,
        ),
    )
}
