"""Webhook URLs: encoded exactly as urlencode would, and verified only with their own signature."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

from hypothesis import given
from hypothesis import strategies as st

from aigcq.plumbing.signing import signature, verify, webhook_url

KEY = b"k" * 32


@given(task_id=st.text(min_size=1, max_size=80), attempt=st.integers(min_value=0, max_value=10**6))
def test_the_url_is_urlencodes_and_carries_a_valid_signature(task_id: str, attempt: int) -> None:
    url = webhook_url("http://aigcq:8001", KEY, task_id, attempt)
    sig = signature(KEY, task_id, attempt)
    assert url == "http://aigcq:8001/callback/all?" + urlencode(
        {"t": task_id, "a": attempt, "s": sig}
    )
    query = parse_qs(urlsplit(url).query, keep_blank_values=True, strict_parsing=True)
    assert query == {"t": [task_id], "a": [str(attempt)], "s": [sig]}
    assert verify(KEY, task_id, attempt, sig)


def test_a_signature_is_bound_to_key_task_and_attempt() -> None:
    sig = signature(KEY, "t1", 1)
    assert len(sig) == 32 and int(sig, 16) >= 0
    assert not verify(KEY, "t1", 2, sig)
    assert not verify(KEY, "t2", 1, sig)
    assert not verify(b"other" * 8, "t1", 1, sig)
    assert not verify(KEY, "t1", 1, "0" * 32)


def test_nothing_is_signed_or_verified_with_an_empty_key() -> None:
    """Issue 15 item 12: an empty key would let anyone sign a TASK_END."""
    import pytest

    forged = hmac_of_empty_key("t1", 1)
    assert not verify(b"", "t1", 1, forged)
    with pytest.raises(ValueError, match="empty"):
        webhook_url("http://aigcq", b"", "t1", 1)


def hmac_of_empty_key(task_id: str, attempt: int) -> str:
    import hashlib
    import hmac

    return hmac.digest(b"", f"{task_id}:{attempt}".encode(), hashlib.sha256).hex()[:32]


def test_serve_refuses_to_start_without_a_webhook_signing_key(tmp_path: Path) -> None:
    """Client tokens configured, no TOKEN_SECRET and no CALLBACK_SECRET: exit 2, say why."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AIGCQ_") and k not in ("TOKEN_SECRET", "CALLBACK_SECRET")
    }
    env |= {"AIGCQ_REDIS_URL": "redis://127.0.0.1:1", "AIGCQ_CLIENT_TOKENS": '["static-token"]'}
    env |= {"AIGCQ_WS_PORT": "0", "AIGCQ_CALLBACK_PORT": "0"}  # never the defaults
    proc = subprocess.run(
        [sys.executable, "-m", "aigcq", "serve"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "webhook URLs cannot be signed" in proc.stderr + proc.stdout
