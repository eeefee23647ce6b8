"""Every documented route of serve and of the message-dispatcher (their OpenAPI) answers
malformed input with a 4xx, never a 5xx: a webhook signature holding non-ASCII text is a 403
(issue 42 item 12), in serve and in the message-dispatcher; then a bounded fuzz run over each
whole document.

The regression tests go over real sockets. The fuzz run is derandomized (a failure is
reproducible) and goes through the ASGI transport, as tests/asynch/test_fuzz.py does: over
loopback each request costs ~40 ms of delayed ACKs, and what it checks is the app's answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aigcq.config import PlatformConfig, Settings
from aigcq.plumbing.auth import issue_client_token
from aigcq.serve.server import ServeProcess
from tests.fakes.message_dispatcher import Md, md
from tests.fakes.servers import serve_app
from tests.fakes.snapshot import redis_snapshot

__all__ = ["md"]  # a fixture: imported for pytest to find

SECRET = "fuzz-secret-with-at-least-32-bytes-of-key"
ADMIN = "fuzz-admin-token"
#: signatures a sender may put in ``s=``: non-ASCII, NUL, too long, empty, a lone surrogate
MALFORMED_SIGNATURES = ["%C3%A9", "%E2%82%AC" * 16, "%00", "a" * 500, "", "%ED%A0%80"]


@pytest.fixture
async def serve(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> ServeProcess:
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}')
    settings = Settings(
        redis_url=redis_url, token_secret=SECRET, config_dir=tmp_path, data_dir=tmp_path,
        admin_token=ADMIN, max_payload_bytes=2000,
    )  # fmt: skip
    return ServeProcess(settings, PlatformConfig.load(tmp_path), redis)


@pytest.fixture
async def http(serve: ServeProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_app(serve.app) as base, httpx.AsyncClient(base_url=base) as client:
        yield client


async def _malformed_signatures_refused(http: httpx.AsyncClient, redis: aioredis.Redis) -> None:
    before = await redis_snapshot(redis)
    body = {"event": "TASK_END", "taskId": "t1", "eventData": '{"code": 0}'}
    for path in ("/callback", "/callback/all"):
        for sig in MALFORMED_SIGNATURES:
            resp = await http.post(f"{path}?t=t1&a=1&s={sig}", json=body)
            assert resp.status_code == 403, (path, sig, resp.status_code, resp.text)
            assert resp.json()["code"] == "SignatureError", resp.text
    assert await redis_snapshot(redis) == before


async def test_serve_refuses_a_malformed_signature_with_403(
    http: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    await _malformed_signatures_refused(http, redis)


async def test_dispatcher_refuses_a_malformed_signature_with_403(md: Md) -> None:
    await _malformed_signatures_refused(md.http, md.redis)


_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "é", "\u0000", "..", "%", "1", "-1", "9" * 30, "proj", "t1", "a/b"]),
)
_json: Any = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), _text),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
    max_leaves=6,
)
#: each round sends one request to every documented operation (23 today: some 450 requests)
ROUNDS = 20
_TOKENS = [None, "", "é", "garbage", issue_client_token(SECRET, "b1"), ADMIN]


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """Every documented HTTP operation (not the WebSockets' GETs, nor server-sent events)."""
    found = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            socket = "websocket" in json.dumps(operation).lower()
            if not socket and not path.endswith("/events"):
                found.append((path, method.upper(), operation))
    return found


_digits = st.from_regex(r"\A[0-9]{1,3}\Z")


def _query(operation: dict[str, Any]) -> Any:
    """The operation's query parameters: the required ones always (digits half the time, so
    a webhook's attempt reads as one), the others and an unknown one at times."""
    required, optional = {}, {"x": _text}
    for param in operation.get("parameters", []):
        if param["in"] == "query":
            value = st.one_of(_digits, _text)
            (required if param.get("required") else optional)[param["name"]] = value
    return st.fixed_dictionaries(required, optional=optional)


@st.composite
def _request(draw: st.DrawFn, path: str, method: str, operation: dict[str, Any]) -> Any:
    """One request to one operation: any path parameters, any token, any body."""
    path = re.sub(r"\{[^}]+\}", lambda _: quote(draw(_text), safe=""), path)
    token = draw(st.sampled_from(_TOKENS))
    headers = {"Authorization": f"Bearer {token}".encode()} if token is not None else {}
    if draw(st.booleans()):
        content = draw(st.binary(max_size=40))
    else:
        content = json.dumps(draw(_json)).encode()
    return method, path, {"params": draw(_query(operation)), "headers": headers, "content": content}


def _rounds(schema: dict[str, Any]) -> Any:
    """A request to every documented operation, each drawn on its own."""
    return st.tuples(*(_request(*op) for op in _operations(schema)))


async def _fuzz(app: Any, required: set[str]) -> None:
    """``ROUNDS`` rounds over every operation ``app``'s OpenAPI document names: no 5xx."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://fuzz") as client:
        schema = (await client.get("/openapi.json")).json()
        assert required <= set(schema["paths"]), sorted(schema["paths"])
        rounds: list[tuple[tuple[str, str, dict[str, Any]], ...]] = []

        @settings(
            max_examples=ROUNDS,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(requests=_rounds(schema))
        def record(requests: tuple[tuple[str, str, dict[str, Any]], ...]) -> None:
            rounds.append(requests)

        record()  # hypothesis draws synchronously; the requests go out below
        for requests in rounds:
            for method, path, kwargs in requests:
                resp = await client.request(method, path, **kwargs)
                assert resp.status_code < 500, (method, path, kwargs, resp.text)


async def test_fuzz_every_documented_route_never_answers_5xx(serve: ServeProcess) -> None:
    await _fuzz(serve.app, {"/callback/all", "/api/tasks"})


async def test_fuzz_the_dispatchers_documented_routes_never_answer_5xx(md: Md) -> None:
    await _fuzz(md.dispatcher.app, {"/callback/all", "/api/task"})
