"""Redis replies as text, whichever way the connection decodes them."""

from __future__ import annotations


def text(value: object) -> str:
    """``value`` as ``str``: bytes decoded as UTF-8, ``None`` as the empty string."""
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)
