"""ComfyUI workflows the emulator runs (API-format graphs), a PNG reader for its output, and
an emulated ComfyUI killed mid-prompt."""

from __future__ import annotations

import struct
import zlib
from typing import Any

from aigcq.emulators.comfyui import ComfyUIEmulator
from tests.fakes.servers import Served


def invert_graph(prefix: str) -> dict[str, Any]:
    """EmptyImage (64×48, red) → ImageInvert → SaveImage with ``prefix``."""
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 64, "height": 48, "batch_size": 1, "color": 0xFF0000},
        },
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": prefix}},
    }


#: the in-process tests' graph (files named ``bt_*``)
GRAPH: dict[str, Any] = invert_graph("bt")
#: the same graph as the e2e tests send it (files named ``e2e_*``)
E2E_GRAPH: dict[str, Any] = invert_graph("e2e")


def model_graph(ckpt: str) -> dict[str, Any]:
    """CheckpointLoaderSimple → VAEDecode(EmptyLatentImage) → SaveImage, as in ComfyUI."""
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "5": {
            "class_type": "EmptyLatentImage",
            "inputs": {"width": 64, "height": 64, "batch_size": 1},
        },
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "m"}},
    }


def read_png(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, first pixel RGB) of an 8-bit RGB PNG; checks signature and CRCs."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        tag, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(tag + body) == crc, tag
        chunks[tag] = chunks.get(tag, b"") + body
        pos += 12 + length
    width, height, depth, color_type = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color_type) == (8, 2)
    raw = zlib.decompress(chunks[b"IDAT"])
    assert len(raw) == height * (1 + 3 * width)
    return width, height, raw[1:4]


async def kill(served: Served, emulator: ComfyUIEmulator) -> None:
    """The ComfyUI process behind ``served`` killed: unreachable at once (connections reset,
    none accepted), its running prompt never finished, its queue and history gone."""
    served.kill()
    await emulator.restart()
