"""Per-task webhook URLs: an HMAC over (taskId, attempt) in the query string.

A callback is accepted only with a valid signature, so forged callbacks (and callbacks
for tasks we never handed out) are refused without touching any state.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlencode


def signature(key: bytes, task_id: str, attempt: int) -> str:
    msg = f"{task_id}:{attempt}".encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()[:32]


def webhook_url(base: str, key: bytes, task_id: str, attempt: int) -> str:
    query = urlencode({"t": task_id, "a": attempt, "s": signature(key, task_id, attempt)})
    return f"{base}/callback/all?{query}"


def verify(key: bytes, task_id: str, attempt: int, given: str) -> bool:
    return hmac.compare_digest(signature(key, task_id, attempt), given)
