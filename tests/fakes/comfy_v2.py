"""Comfy-Org's official Comfy API v2 client (``comfy-sdk``), unchanged, pointed at a test
fleet's serve as its README says: the base URL and a client token as the API key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from comfy_sdk import AsyncComfy

from aigcq.plumbing.auth import issue_client_token
from tests.fakes.fleet import SECRET, Fleet


def base(f: Fleet) -> str:
    """The serve's HTTP origin (its client socket's)."""
    return "http" + f.client.url.split("/?", 1)[0][2:]


@asynccontextmanager
async def official_client(
    f: Fleet, monkeypatch: pytest.MonkeyPatch, user: str = "v2-user"
) -> AsyncIterator[AsyncComfy]:
    monkeypatch.setenv("COMFY_BASE_URL", base(f))
    async with AsyncComfy(api_key=issue_client_token(SECRET, user), timeout=15.0) as c:
        yield c
