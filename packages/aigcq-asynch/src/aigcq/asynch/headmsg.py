"""``headMsg`` / ``modelKey``: ``Key:Value,Key:Value`` → HTTP headers (values kept as strings)."""

from __future__ import annotations

import re

from aigcq.asynch.errors import AsynchError, Code

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# Framing and hop-by-hop headers belong to the HTTP client: a Content-Length of ours would
# leave the model service waiting for bytes that never come.
RESERVED = frozenset(
    {"connection", "content-length", "expect", "keep-alive", "proxy-connection", "te",
     "trailer", "transfer-encoding", "upgrade"}
)  # fmt: skip


def parse_head_msg(text: str, field: str = "headMsg") -> dict[str, str]:
    """Parse ``Key:Value`` pairs separated by commas; a value may itself contain ``:``.

    Raises :class:`AsynchError` (``INVALID_HEAD_MSG``) naming the bad entry.
    """
    headers: dict[str, str] = {}
    if not text.strip():
        return headers
    for index, entry in enumerate(text.split(","), start=1):
        name, sep, value = entry.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name:
            raise AsynchError(
                Code.INVALID_HEAD_MSG, f"{field}: entry {index} {entry!r} is not Key:Value"
            )
        if not _TOKEN.match(name):
            raise AsynchError(
                Code.INVALID_HEAD_MSG, f"{field}: entry {index}: {name!r} is not a header name"
            )
        if name.lower() in RESERVED:
            raise AsynchError(
                Code.INVALID_HEAD_MSG,
                f"{field}: entry {index}: {name!r} is set by the HTTP client, not configurable",
            )
        if _BAD_VALUE.search(value):
            raise AsynchError(
                Code.INVALID_HEAD_MSG, f"{field}: entry {index}: value has control characters"
            )
        headers[name] = value
    return headers


def merge_headers(head_msg: str, model_key: str) -> dict[str, str]:
    """The model's ``head_msg`` headers, overridden or extended by the task's ``modelKey``
    (header names compare case-insensitively)."""
    merged = {k.lower(): (k, v) for k, v in parse_head_msg(head_msg).items()}
    for k, v in parse_head_msg(model_key, "modelKey").items():
        merged[k.lower()] = (k, v)
    return dict(merged.values())
