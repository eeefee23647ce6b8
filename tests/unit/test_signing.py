"""Webhook URLs: encoded exactly as urlencode would, and verified only with their own signature."""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode, urlsplit

from hypothesis import given
from hypothesis import strategies as st

from aigcq.gateway.signing import signature, verify, webhook_url

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
