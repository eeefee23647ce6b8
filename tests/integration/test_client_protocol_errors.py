"""The client protocol's error paths against a real Redis and the app on 127.0.0.1: binary
frames, an ``ack`` without ids, ids bound to tokens (``AIGCQ_BIND_CLIENT_IDS``), retrying a
finished task, and the Chinese default messages of every error code."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import redis.asyncio as aioredis

from aigcq.plumbing.auth import issue_client_token
from aigcq.plumbing.signing import webhook_url
from tests.fakes.client import Client, generate
from tests.fakes.gateway import SECRET, STATIC, Server, serve, token
from tests.fakes.snapshot import redis_snapshot

ADMIN = {"Authorization": "Bearer admin"}


@pytest.fixture
async def server(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[Server]:
    async with serve(tmp_path, redis, redis_url) as server:
        yield server


def bearer(backend_id: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(backend_id)}"}


async def succeed(server: Server, task_id: str) -> None:
    """Report a successful TASK_END for the task's first attempt (signed webhook)."""
    url = webhook_url(server.base, SECRET.encode(), task_id, 0)
    body = {"event": "TASK_END", "taskId": "r", "eventData": '{"code":0,"msg":"success"}'}
    async with httpx.AsyncClient() as http:
        assert (await http.post(url, json=body)).status_code == 200


# ---- WebSocket ----------------------------------------------------------------------------


@pytest.mark.parametrize("frame", [b"\x00\xff\xfe binary", b"{not json"])
async def test_a_binary_frame_gets_json_error_and_the_connection_stays_open(
    server: Server, frame: bytes
) -> None:
    client = await server.client()
    before = await redis_snapshot(server.redis)
    await client.ws.send(frame)
    reply = await client.next()
    assert reply["type"] == "error" and reply["code"] == "JSONError"
    assert reply["msg"] == "消息格式错误，请联系服务商。" and "malformed JSON" in reply["detail"]
    assert await redis_snapshot(server.redis) == before
    assert (await client.request({"type": "ping"}))["type"] == "pong"  # still open
    await client.close()


async def test_a_binary_frame_holding_json_is_read_like_a_text_frame(server: Server) -> None:
    client = await server.client()
    await client.ws.send(b'{"type": "ping"}')
    assert (await client.next())["type"] == "pong"
    await client.close()


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"type": "ack"}, "id"),
        ({"type": "ack", "id": 7}, "id"),
        ({"type": "ack", "ids": "1-0"}, "ids"),
        ({"type": "ack", "ids": ["1-0", 2]}, "ids"),
    ],
)
async def test_an_ack_without_string_ids_gets_json_error_naming_the_field(
    server: Server, message: dict[str, Any], field: str
) -> None:
    client = await server.client()
    reply = await client.request(message)
    assert reply["type"] == "error" and reply["code"] == "JSONError"
    assert reply["detail"].startswith(f"{field}: ")
    await client.close()


async def test_a_well_formed_ack_gets_no_reply(server: Server) -> None:
    client = await server.client()
    await client.send({"type": "ack", "ids": ["1-0"]})
    await client.send({"type": "ack", "id": "2-0"})
    assert (await client.request({"type": "ping"}))["type"] == "pong"  # the first reply
    await client.close()


async def test_a_token_naming_its_client_may_not_take_another_clients_id(
    server: Server,
) -> None:
    """By default a JWT with a sub speaks for that backend only: it cannot connect as
    another and take its undelivered results; a JWT without sub names no client."""
    before = await redis_snapshot(server.redis)
    stranger = await Client(server.port, "b2", token("b1")).connect()
    refusal = await stranger.next()
    assert (refusal["type"], refusal["code"]) == ("error", "AuthError")
    await stranger.ws.wait_closed()
    assert stranger.ws.close_code == 4401
    assert await redis_snapshot(server.redis) == before
    no_sub = jwt.encode({"exp": time.time() + 60}, SECRET)
    client = await Client(server.port, "b2", no_sub).connect()
    assert (await client.request({"type": "ping"}))["type"] == "pong"
    await client.close()


async def test_unbound_ids_are_an_explicit_setting(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with serve(tmp_path, redis, redis_url, bind_client_ids="off") as server:
        client = await Client(server.port, "b2", token("b1")).connect()  # the seed's way
        assert (await client.request({"type": "ping"}))["type"] == "pong"
        await client.close()


async def test_bound_ids_refuse_another_backends_id(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with serve(tmp_path, redis, redis_url, bind_client_ids="all") as server:
        both = issue_client_token(SECRET, "b1", ids=["b1-2"])  # names each id it uses
        for backend_id, credential in (("b1", token("b1")), ("b1-2", both)):
            client = await Client(server.port, backend_id, credential).connect()
            assert (await client.request({"type": "ping"}))["type"] == "pong"
            await client.close()
        no_sub = jwt.encode({"exp": time.time() + 60}, SECRET)
        stranger = await Client(server.port, "b1", no_sub).connect()
        assert (await stranger.next())["code"] == "AuthError"
        static = await Client(server.port, "anyone", STATIC).connect()
        assert (await static.request({"type": "ping"}))["type"] == "pong"
        await static.close()

        before = await redis_snapshot(server.redis)
        for backend_id in ("b2", "b10", "b1-2"):  # b1-2: another client's id
            stranger = await Client(server.port, backend_id, token("b1")).connect()
            refusal = await stranger.next()
            assert (refusal["type"], refusal["code"]) == ("error", "AuthError")
            await stranger.ws.wait_closed()
            assert stranger.ws.close_code == 4401
        async with httpx.AsyncClient(base_url=server.base) as http:
            body = {**generate("t-http"), "backendId": "b2"}
            refused = await http.post("/api/tasks", json=body, headers=bearer("b1"))
        assert refused.status_code == 401 and refused.json()["code"] == "AuthError"
        assert await redis_snapshot(server.redis) == before


# ---- HTTP ---------------------------------------------------------------------------------


async def test_only_the_tasks_backend_may_cancel_it(server: Server) -> None:
    client = await server.client("b1")
    await client.request(generate("mine"))  # waits: the platform's concurrency is 0
    no_sub = {"Authorization": f"Bearer {jwt.encode({'exp': time.time() + 60}, SECRET)}"}
    async with httpx.AsyncClient(base_url=server.base) as http:
        for headers in (bearer("b2"), no_sub):  # a JWT without sub speaks for no backend
            refused = await http.post("/api/tasks/mine/cancel", headers=headers)
            assert (refused.status_code, refused.json()["code"]) == (404, "TaskNotFound")
        done = await http.post("/api/tasks/mine/cancel", headers=bearer("b1"))
        assert done.json() == {"taskId": "mine", "state": "cancelled"}
    await client.close()


async def test_retrying_a_succeeded_task_is_task_not_retryable(server: Server) -> None:
    client = await server.client()
    await client.request(generate("done"))
    await succeed(server, "done")
    async with httpx.AsyncClient(base_url=server.base) as http:
        before = await redis_snapshot(server.redis)
        r = await http.post("/api/admin/tasks/done/retry", headers=ADMIN)
        assert await redis_snapshot(server.redis) == before
    assert r.status_code == 409
    assert r.json()["code"] == "TaskNotRetryable"
    assert r.json()["msg"] == "只有失败或已取消的任务可以重试。"
    assert r.json()["detail"] == "a success task cannot be retried"
    await client.close()


async def test_not_found_gone_and_signature_errors_have_chinese_messages(
    server: Server,
) -> None:
    client = await server.client()
    await client.request(generate("t1"))
    body = {"event": "TASK_END", "taskId": "r", "eventData": '{"code":0,"msg":"success"}'}
    async with httpx.AsyncClient(base_url=server.base) as http:
        missing = await http.get("/api/tasks/nope", headers=ADMIN)
        unsigned = await http.post("/callback/all", json=body)
        await succeed(server, "t1")
        late = {**body, "eventData": '{"code":1,"msg":"failed"}'}  # not the end it had
        replay = await http.post(webhook_url(server.base, SECRET.encode(), "t1", 0), json=late)
    assert (missing.status_code, missing.json()["msg"]) == (404, "任务不存在。")
    assert (unsigned.status_code, unsigned.json()["msg"]) == (403, "签名校验失败。")
    assert (replay.status_code, replay.json()["msg"]) == (410, "任务已结束。")
    await client.close()
