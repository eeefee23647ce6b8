"""Images as ComfyUI's weight-free nodes make them, and real PNG files without Pillow (also
the platform emulators' result files)."""

from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import dataclass

log = logging.getLogger(__name__)


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


def decode_png(data: bytes) -> Image | None:
    """The image of an 8-bit RGB PNG with unfiltered rows (as :func:`encode_png` writes);
    another PNG: a gray image of its size; not a PNG: None."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or len(data) < 33 or data[12:16] != b"IHDR":
        return None
    width, height, depth, kind = struct.unpack(">IIBB", data[16:26])
    gray = Image(width, height, b"\x80" * (3 * width * height))
    if (depth, kind) != (8, 2) or width * height > 1 << 24:
        return gray
    pos, idat = 8, b""
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        if data[pos + 4 : pos + 8] == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    try:
        raw = zlib.decompress(idat)
    except zlib.error:
        return gray
    stride = 1 + 3 * width
    rows = [raw[y * stride : (y + 1) * stride] for y in range(height)]
    if len(raw) != stride * height or any(row[0] != 0 for row in rows):
        return gray
    return Image(width, height, b"".join(row[1:] for row in rows))


def tiny_png(rgb: tuple[int, int, int], size: int = 8) -> bytes:
    """A valid ``size``×``size`` PNG of one colour."""
    return encode_png(Image(size, size, bytes(rgb) * (size * size)))
