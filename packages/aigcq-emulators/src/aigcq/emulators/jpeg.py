"""Real JPEG files without Pillow: one colour, 8×8, baseline (the JimuAI emulator's results,
as JimuAI documents its ``image_urls`` as JPEG images).

One 8×8 block per component (Y, Cb, Cr, no subsampling), a quantisation table of ones, so
a solid colour is its DC coefficients alone; one DC Huffman table (JPEG's standard
luminance DC codes) and one AC table holding only end-of-block.
"""

from __future__ import annotations

import struct

#: JPEG's standard luminance DC table (ITU T.81 K.3): code lengths 1..16, then the symbols
_DC_BITS = (0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0)
_DC_SYMBOLS = tuple(range(12))


def _dc_codes() -> dict[int, tuple[int, int]]:
    """symbol -> (code, length), assigned canonically from the lengths."""
    codes, code, symbols = {}, 0, iter(_DC_SYMBOLS)
    for length, count in enumerate(_DC_BITS, start=1):
        for _ in range(count):
            codes[next(symbols)] = (code, length)
            code += 1
        code <<= 1
    return codes


_DC_CODES = _dc_codes()


class _Bits:
    def __init__(self) -> None:
        self.value, self.length = 0, 0

    def put(self, value: int, length: int) -> None:
        self.value, self.length = (self.value << length) | value, self.length + length

    def scan_data(self) -> bytes:
        """The bits padded with ones to a byte, every 0xFF byte stuffed with a 0x00."""
        pad = -self.length % 8
        raw = ((self.value << pad) | ((1 << pad) - 1)).to_bytes((self.length + pad) // 8, "big")
        return raw.replace(b"\xff", b"\xff\x00")


def _segment(marker: int, payload: bytes) -> bytes:
    return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload


def _dc(level: float) -> int:
    """An 8×8 block of ``level`` (0..255): its DC coefficient (quantised by 1)."""
    return round(8 * (level - 128))


def solid_jpeg(rgb: tuple[int, int, int]) -> bytes:
    """A valid 8×8 baseline JPEG of one colour."""
    r, g, b = rgb
    levels = (
        0.299 * r + 0.587 * g + 0.114 * b,
        -0.168736 * r - 0.331264 * g + 0.5 * b + 128,
        0.5 * r - 0.418688 * g - 0.081312 * b + 128,
    )
    bits = _Bits()
    for level in levels:
        diff = max(-2047, min(2047, _dc(level)))  # the first block: its DC predicts from 0
        size = abs(diff).bit_length()
        bits.put(*_DC_CODES[size])
        if size:
            bits.put(diff if diff > 0 else diff + (1 << size) - 1, size)
        bits.put(0, 1)  # end of block: the AC table's only code
    components = b"".join(struct.pack(">BBB", i, 0x11, 0) for i in (1, 2, 3))
    return b"".join(
        (
            b"\xff\xd8",
            _segment(0xDB, b"\x00" + b"\x01" * 64),
            _segment(0xC0, struct.pack(">BHHB", 8, 8, 8, 3) + components),
            _segment(0xC4, b"\x00" + bytes(_DC_BITS) + bytes(_DC_SYMBOLS)),
            _segment(0xC4, b"\x10" + bytes((1,) + (0,) * 15) + b"\x00"),
            _segment(0xDA, b"\x03" + b"".join(bytes((i, 0)) for i in (1, 2, 3)) + b"\x00\x3f\x00"),
            bits.scan_data(),
            b"\xff\xd9",
        )
    )
