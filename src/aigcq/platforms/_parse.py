"""Small tolerant parsing helpers shared by the HTTP platform adapters."""

from __future__ import annotations

import json
import math
from typing import Any

from aigcq.platforms.base import Full, Rejected, Uncertain


def as_int(value: Any) -> int | None:
    """``value`` as an int (platforms send codes as numbers or strings), else None."""
    if isinstance(value, bool):
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def as_amount(value: Any) -> float | None:
    """``value`` as a finite amount ≥ 0 (platforms send figures as numbers or strings),
    else None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        amount = float(str(value).strip())
    except ValueError:
        return None
    return amount if math.isfinite(amount) and amount >= 0 else None


def loads_if_json(value: Any) -> Any:
    """Decode ``value`` when it is a string (or bytes) holding a JSON object or array."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str) or value.lstrip()[:1] not in ("{", "["):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):  # nested too deep for the decoder: not JSON to us
        return value


def unreadable_create(status: int) -> Full | Uncertain:
    """A paid create answered without the platform's own documented body (a gateway's HTML
    502 or 504, a page we cannot parse): it may have gone through and be billed, so its
    outcome is unknown — only the platform's own code is a definite refusal. A 429 is the
    exception: by HTTP's definition nothing was processed."""
    if status == 429:
        return Full(f"HTTP {status}")
    return Uncertain(f"no readable reply (HTTP {status})")


def http_outcome(prefix: str, status: int) -> Full | Rejected:
    """A submit answered without a usable body, where sending it again costs nothing (the
    message-dispatcher, our own GPUs): judge by the HTTP status alone."""
    if status == 429:
        return Full(f"HTTP {status}")
    retryable = status == 408 or not 400 <= status < 500
    return Rejected(f"{prefix}_HTTP_{status}", f"no valid reply (HTTP {status})", retryable)
