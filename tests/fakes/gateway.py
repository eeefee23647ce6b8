"""The secret the gateway tests' services sign client tokens with, and such a token."""

from __future__ import annotations

from aigcq.plumbing.auth import issue_client_token

SECRET = "gw-secret-with-at-least-32-bytes-of-key"


def token(backend_id: str = "b1") -> str:
    return issue_client_token(SECRET, backend_id)
