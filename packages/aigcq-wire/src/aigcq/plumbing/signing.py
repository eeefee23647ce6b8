"""Per-task webhook URLs: an HMAC over (taskId, attempt) in the query string.

A callback is accepted only with a valid signature, so forged callbacks (and callbacks
for tasks we never handed out) are refused without touching any state.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import quote_plus


def signature(key: bytes, task_id: str, attempt: int) -> str:
    if not key:  # anyone could compute it: refuse to sign (verify refuses to check)
        raise ValueError("empty webhook signing key")
    return hmac.digest(key, f"{task_id}:{attempt}".encode(), hashlib.sha256).hex()[:32]


def webhook_url(base: str, key: bytes, task_id: str, attempt: int, *, keep: bool = False) -> str:
    """``{base}/callback/all?t=&a=&s=``, encoded as ``urlencode`` would (a URL per task
    assigned: formatting it directly costs a seventh of ``urlencode``). ``keep`` adds
    ``&k=1``: the sender is a paid target whose result files may be copied (result custody),
    so only its TASK_ENDs pay for that look; it is not signed, and only makes a TASK_END
    look the task up for custody's sake."""
    sig = signature(key, task_id, attempt)
    keep_files = "&k=1" if keep else ""
    return f"{base}/callback/all?t={quote_plus(task_id, safe='')}&a={attempt}&s={sig}{keep_files}"


def verify(key: bytes, task_id: str, attempt: int, given: str) -> bool:
    if not key:
        return False
    return same_digest(signature(key, task_id, attempt), given)


def same_digest(expected: str, given: str) -> bool:
    """``given`` (any text a request carried) is the hex digest ``expected``, compared in
    constant time: as bytes, since ``hmac.compare_digest`` raises on non-ASCII text."""
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogatepass"))
