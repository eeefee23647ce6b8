"""Security defaults that differ from the seed stay, but every refusal names what to
configure (issue 30 item 5): client tokens, id binding, the admin token, bridge tokens,
signed callbacks, the message-dispatcher's login and its capacity feed, the bridge's own
admin page. Each against the real servers on a real Redis."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis
import websockets

from aigcq.agent.web import bridge_routes
from aigcq.config import PlatformConfig, Settings
from aigcq.plumbing.auth import issue_client_token
from aigcq.serve.server import ServeProcess
from tests.fakes.bridge import Bridge
from tests.fakes.message_dispatcher import LOGIN, Md, md
from tests.fakes.servers import serve_app, serve_handler

__all__ = ["md"]  # a fixture: imported for pytest to find

SECRET = "refusal-secret-with-at-least-32-bytes-of-key"
TASK_END = {"event": "TASK_END", "taskId": "t", "eventData": '{"code":0,"msg":"success"}'}


async def _serve(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, **settings: Any
) -> ServeProcess:
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}')
    s = Settings(redis_url=redis_url, config_dir=tmp_path, data_dir=tmp_path, **settings)
    return ServeProcess(s, PlatformConfig.load(tmp_path), redis)


@pytest.fixture
async def base(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[str]:
    """Serve with every secret set: TOKEN_SECRET, the admin and the bridge token."""
    service = await _serve(
        tmp_path, redis, redis_url, token_secret=SECRET, admin_token="adm", bridge_token="brt"
    )
    async with serve_app(service.app) as url:
        yield url


@pytest.fixture
async def bare(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[str]:
    """Serve with only a callback secret: it accepts no client token and no bridge."""
    service = await _serve(tmp_path, redis, redis_url, callback_secret=SECRET)
    async with serve_app(service.app) as url:
        yield url


async def _ws_error(url: str) -> tuple[dict[str, object], int | None]:
    """The first frame a refused socket gets, and its close code."""
    async with websockets.connect(url) as ws:
        frame = orjson.loads(await ws.recv())
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
        return frame, ws.close_code


# ---- clients --------------------------------------------------------------------------


async def test_a_client_without_a_token_is_told_what_to_send(base: str) -> None:
    ws_base = base.replace("http", "ws", 1)
    frame, code = await _ws_error(f"{ws_base}/?id=b1")
    assert code == 4401 and frame["code"] == "AuthError"
    assert "TOKEN_SECRET" in str(frame["detail"]) and "?token=" in str(frame["detail"])
    async with httpx.AsyncClient(base_url=base) as http:
        reply = (await http.get("/api/queues")).json()
    assert "TOKEN_SECRET" in reply["detail"] and "Authorization: Bearer" in reply["detail"]
    assert "AIGCQ_CLIENT_TOKENS" in reply["detail"]


async def test_a_server_with_no_client_secret_says_so(bare: str) -> None:
    async with httpx.AsyncClient(base_url=bare) as http:
        reply = (await http.get("/api/queues", headers={"Authorization": "Bearer x"})).json()
    assert "this server accepts no client token" in reply["detail"]
    assert "TOKEN_SECRET" in reply["detail"] and "AIGCQ_CLIENT_TOKENS" in reply["detail"]


async def test_an_expired_token_says_how_to_get_a_new_one(base: str) -> None:
    expired = issue_client_token(SECRET, "b1", ttl_s=-10)
    async with httpx.AsyncClient(base_url=base) as http:
        reply = (
            await http.get("/api/queues", headers={"Authorization": f"Bearer {expired}"})
        ).json()
    assert reply["detail"].startswith("token expired at ") and "aigcq token" in reply["detail"]


async def test_a_token_bound_to_another_id_names_the_binding_setting(base: str) -> None:
    ws_base = base.replace("http", "ws", 1)
    token = issue_client_token(SECRET, "alice")
    frame, code = await _ws_error(f"{ws_base}/?id=bob&token={token}")
    assert code == 4401 and "AIGCQ_BIND_CLIENT_IDS" in str(frame["detail"])
    assert "'alice'" in str(frame["detail"])


async def test_the_admin_api_names_the_admin_token(base: str) -> None:
    async with httpx.AsyncClient(base_url=base) as http:
        reply = (await http.put("/api/workflows/w", json={})).json()
        bridge_route = (await http.get("/api/workflows/w")).json()
    assert reply["code"] == "AuthError" and "AIGCQ_ADMIN_TOKEN" in reply["detail"]
    assert "secrets.json" in reply["detail"]
    assert "AIGCQ_BRIDGE_TOKEN" in bridge_route["detail"]


# ---- bridges ----------------------------------------------------------------------------


async def test_a_bridge_without_the_token_is_told_where_to_put_it(base: str) -> None:
    port = int(base.rsplit(":", 1)[1])
    bridge = await Bridge.connect(port, token=None)
    await bridge.register()
    error = await bridge.next()
    assert error["type"] == "ERROR" and error["data"]["code"] == "AuthError"
    msg = error["data"]["msg"]
    assert "AIGCQ_BRIDGE_TOKEN" in msg and "?token=" in msg and "data.token" in msg
    assert await bridge.close_code() == 4401


async def test_a_server_without_a_bridge_token_says_every_bridge_is_refused(bare: str) -> None:
    bridge = await Bridge.connect(int(bare.rsplit(":", 1)[1]), token="anything")
    error = await bridge.next()
    assert "this server has no AIGCQ_BRIDGE_TOKEN" in error["data"]["msg"]


@pytest.mark.parametrize(
    ("query", "mentions"),
    [
        ("", "webhookUrl"),  # a seed bridge posting to a fixed /callback
        ("?t=t&a=1&s=forged", "AIGCQ_CALLBACK_SECRET"),
    ],
)
async def test_an_unsigned_or_badly_signed_callback_names_the_fix(
    base: str, query: str, mentions: str
) -> None:
    async with httpx.AsyncClient(base_url=base) as http:
        resp = await http.post(f"/callback{query}", json=TASK_END)
    assert resp.status_code == 403 and mentions in resp.json()["detail"]


# ---- the message-dispatcher -------------------------------------------------------------


async def test_the_dispatchers_refusals_name_its_login(md: Md) -> None:
    wrong = await md.http.post("/api/auth/login", json={**LOGIN, "password": "nope"})
    said = wrong.json()["error"]["message"]
    assert wrong.status_code == 401 and "MD_PASSWORD" in said and "secrets.json" in said
    task = await md.http.post("/api/task", json={"workflowId": "1"})
    said = task.json()["error"]["message"]
    assert task.status_code == 401 and "/api/auth/login" in said and "MD_USERNAME" in said


async def test_the_capacity_feed_names_its_login(md: Md) -> None:
    url = f"ws://127.0.0.1:{md.port}/ws/capacity"
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "CONNECT", "data": {"clientId": "q"}}))
        error = orjson.loads(await ws.recv())
    assert error["type"] == "ERROR" and "/api/auth/login" in str(error["data"])
    assert "MD_PASSWORD" in str(error["data"])


# ---- the bridge's own admin page --------------------------------------------------------


class _Control:
    """The bridge's side of its admin page (nothing is changed: every call is refused)."""

    token = "admin-page-token"
    files_dir = Path("/nonexistent")

    def status(self) -> dict[str, Any]:
        return {}

    async def set_server(self, url: str) -> None:
        raise AssertionError(f"changed to {url} without the token")


async def test_the_bridge_admin_page_names_the_bridge_token() -> None:
    async with serve_handler(bridge_routes(_Control())) as url, httpx.AsyncClient() as http:
        resp = await http.post(f"{url}/api/server", json={"url": "ws://x/ws"})
    assert resp.status_code == 401 and "AIGCQ_BRIDGE_TOKEN" in resp.json()["detail"]
