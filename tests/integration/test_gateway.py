"""The gateway in-process against a real Redis: bad input of every kind changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import orjson
import pytest
import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.plumbing.signing import webhook_url
from aigcq.serve.server import ServeProcess
from tests.fakes.client import Client
from tests.fakes.gateway import SECRET, serve, token
from tests.fakes.servers import serve_app, stream_until_answered
from tests.fakes.snapshot import redis_snapshot


@pytest.fixture
async def gateway(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> AsyncIterator[tuple[int, aioredis.Redis]]:
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}')
    settings = Settings(
        redis_url=redis_url,
        token_secret=SECRET,
        config_dir=tmp_path,
        max_payload_bytes=4096,
        admin_token="admin",
    )
    service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
    async with serve_app(service.app) as base:
        yield int(base.rsplit(":", 1)[1]), redis


BAD_MESSAGES: list[tuple[str, str]] = [
    ("{not json", "JSONError"),
    ("[1, 2]", "JSONError"),
    ('{"type": "explode"}', "OpcodeError"),
    ('{"type": "generate", "platform": "comfyui", "payload": {}}', "JSONError"),
    ('{"type": "generate", "taskId": 7.5, "platform": "comfyui", "payload": {}}', "JSONError"),
    ('{"type": "generate", "taskId": "a", "platform": "comfyui", "payload": "x"}', "JSONError"),
    ('{"type": "generate", "taskId": "a b", "platform": "comfyui", "payload": {}}', "JSONError"),
    (
        '{"type": "generate", "taskId": "a", "platform": "jimuai", "AIGC": "proj", "payload": {}}',
        "PlatformError",
    ),
    (
        orjson.dumps(
            {
                "type": "generate",
                "taskId": "a",
                "platform": "comfyui",
                "AIGC": "proj",
                "payload": {"x": "y" * 5000},
            }
        ).decode(),
        "PayloadTooLarge",
    ),
]


@pytest.mark.parametrize(("raw", "code"), BAD_MESSAGES)
async def test_bad_client_messages_get_their_code_and_change_nothing(
    gateway: tuple[int, aioredis.Redis], raw: str, code: str
) -> None:
    port, redis = gateway
    client = await Client(port, "b1", token()).connect()
    before = await redis_snapshot(redis)
    reply = await client.request(raw)
    assert reply["type"] == "error" and reply["code"] == code and reply["msg"]
    assert await redis_snapshot(redis) == before
    assert (await client.request({"type": "ping"}))["type"] == "pong"  # still usable
    await client.close()


async def test_bad_token_is_refused(gateway: tuple[int, aioredis.Redis]) -> None:
    port, _ = gateway
    client = await Client(port, "b1", "forged.jwt.token").connect()
    reply = await client.next()
    assert reply["code"] == "AuthError"
    await client.close()


async def test_resubmit_is_idempotent_and_foreign_task_ids_conflict(
    gateway: tuple[int, aioredis.Redis],
) -> None:
    port, redis = gateway
    msg = {
        "type": "generate",
        "taskId": "dup",
        "platform": "comfyui",
        "AIGC": "proj",
        "payload": {"workflowId": "1"},
    }
    client = await Client(port, "b1", token()).connect()
    assert (await client.request(msg))["duplicate"] is False
    assert (await client.request(msg))["duplicate"] is True
    other = await Client(port, "b2", token("b2")).connect()
    assert (await other.request(msg))["code"] == "TaskConflict"
    assert await redis.zcard("aigcq:proj:comfyui:wait") == 1
    await client.close()
    await other.close()


async def test_forged_and_replayed_callbacks_change_nothing(
    gateway: tuple[int, aioredis.Redis],
) -> None:
    port, redis = gateway
    client = await Client(port, "b1", token()).connect()
    await client.request(
        {
            "type": "generate",
            "taskId": "cb",
            "platform": "comfyui",
            "AIGC": "proj",
            "payload": {"workflowId": "1"},
        }
    )
    base = f"http://127.0.0.1:{port}"
    body = {
        "event": "TASK_END",
        "taskId": "remote-1",
        "eventData": orjson.dumps({"code": 0, "msg": "success", "data": []}).decode(),
    }
    async with httpx.AsyncClient() as http:
        before = await redis_snapshot(redis)
        unsigned = await http.post(f"{base}/callback/all", json=body)
        assert unsigned.status_code == 403
        forged = webhook_url(base, b"wrong-key", "cb", 1)
        assert (await http.post(forged, json=body)).status_code == 403
        unknown = webhook_url(base, SECRET.encode(), "nope", 1)
        assert (await http.post(unknown, json=body)).status_code == 404
        assert await redis_snapshot(redis) == before
        good = webhook_url(base, SECRET.encode(), "cb", 1)
        assert (await http.post(good, content=b"{oops")).status_code == 400
        assert (await http.post(good, json=body)).status_code == 200
        result = await client.next()
        assert result["type"] == "result" and result["status"] == "success"
        after = await redis_snapshot(redis)
        assert (await http.post(good, json=body)).status_code == 410  # replay
        assert await redis_snapshot(redis) == after
    await client.close()


async def test_quota_admission_refuses_with_balance_error(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with serve(tmp_path, redis, redis_url, admission="quota", admission_quota=1) as server:
        client = await server.client()
        msg = {"type": "generate", "platform": "comfyui", "AIGC": "proj", "payload": {}}
        assert (await client.request({**msg, "taskId": "q1"}))["type"] == "submitted"
        before = await redis_snapshot(redis)
        assert (await client.request({**msg, "taskId": "q2"}))["code"] == "BalanceError"
        assert await redis_snapshot(redis) == before
        await client.close()


async def test_failure_of_an_abandoned_attempt_is_refused_but_a_late_success_wins(
    gateway: tuple[int, aioredis.Redis],
) -> None:
    port, redis = gateway
    client = await Client(port, "b1", token()).connect()
    for task_id in ("gone", "late"):
        await client.request({"type": "generate", "taskId": task_id, "platform": "comfyui",
                              "AIGC": "proj", "payload": {"workflowId": "1"}})  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def end(code: int) -> dict[str, str]:
        data = {"code": code, "msg": "cancelled" if code else "success", "data": []}
        return {"event": "TASK_END", "taskId": "r", "eventData": orjson.dumps(data).decode()}

    async with httpx.AsyncClient() as http:
        before = await redis_snapshot(redis)
        # Both tasks wait (as after a deadline requeue): a failure report is stale ...
        failed = await http.post(webhook_url(base, SECRET.encode(), "gone", 0), json=end(805))
        assert failed.status_code == 410
        assert await redis_snapshot(redis) == before
        # ... but a success is a real result, delivered once.
        ok = await http.post(webhook_url(base, SECRET.encode(), "late", 0), json=end(0))
        assert ok.status_code == 200
    result = await client.next()
    assert result["taskId"] == "late" and result["status"] == "success"
    await client.close()


# ---- issue 15 items 13 and 14: hostile input ------------------------------------------

HUGE = 32 << 20  # a chunked body far past the 4 KiB limit: refused long before its end


def _generate(task_id: str) -> dict[str, Any]:
    return {"taskId": task_id, "platform": "comfyui", "AIGC": "proj", "payload": {}}


@pytest.mark.parametrize(
    ("method", "target", "auth", "status"),
    [
        ("POST", "/api/tasks", "client", 413),
        ("POST", "/api/tasks", "", 401),
        ("PUT", "/api/workflows/w1", "admin", 413),
        ("PUT", "/api/workflows/w1", "client", 401),
        ("POST", "signed-callback", "", 413),
    ],
)
async def test_a_huge_chunked_body_is_refused_while_it_is_still_being_sent(
    gateway: tuple[int, aioredis.Redis], method: str, target: str, auth: str, status: int
) -> None:
    port, redis = gateway
    base = f"http://127.0.0.1:{port}"
    if target == "signed-callback":
        await http_submit(base, _generate("cb1"))
        target = webhook_url("", SECRET.encode(), "cb1", 0)
    headers = {"Authorization": f"Bearer {token() if auth == 'client' else 'admin'}"}
    before = await redis_snapshot(redis)
    upload = await stream_until_answered(base, method, target, headers if auth else {}, HUGE)
    assert upload.status == status
    assert upload.sent < HUGE  # answered before the body ended: it was never buffered whole
    assert await redis_snapshot(redis) == before


async def http_submit(base: str, body: dict[str, Any], bearer: str = "") -> httpx.Response:
    async with httpx.AsyncClient() as http:
        headers = {"Authorization": f"Bearer {bearer or token()}"}
        return await http.post(f"{base}/api/tasks", json=body, headers=headers)


@pytest.mark.parametrize("attempt", ["\u00b2", "\u0661", "1" * 5000, "-1", ""])
async def test_a_callback_attempt_that_is_not_ascii_digits_is_refused(
    gateway: tuple[int, aioredis.Redis], attempt: str
) -> None:
    port, redis = gateway
    base = f"http://127.0.0.1:{port}"
    await http_submit(base, _generate("att1"))
    before = await redis_snapshot(redis)
    async with httpx.AsyncClient() as http:
        resp = await http.post(
            f"{base}/callback/all",
            params={"t": "att1", "a": attempt, "s": "0" * 32},
            json={"event": "TASK_END", "eventData": '{"code": 0, "data": []}'},
        )
    assert resp.status_code == 403 and resp.json()["code"] == "SignatureError"
    assert await redis_snapshot(redis) == before


@pytest.mark.parametrize(
    "event_data",
    [
        {"code": 0, "msg": "success", "data": "not-a-list"},
        {"code": 0, "msg": "success", "data": {"fileUrl": "x"}},
        {"code": 0, "msg": "success", "data": [1, 2]},
    ],
)
async def test_a_signed_success_whose_data_is_not_a_list_of_outputs_is_refused(
    gateway: tuple[int, aioredis.Redis], event_data: dict[str, Any]
) -> None:
    port, redis = gateway
    base = f"http://127.0.0.1:{port}"
    await http_submit(base, _generate("shape1"))
    before = await redis_snapshot(redis)
    body = {"event": "TASK_END", "eventData": orjson.dumps(event_data).decode()}
    async with httpx.AsyncClient() as http:
        resp = await http.post(webhook_url(base, SECRET.encode(), "shape1", 0), json=body)
    assert resp.status_code == 400 and resp.json()["code"] == "JSONError"
    assert await redis_snapshot(redis) == before


async def test_a_client_jwt_without_exp_is_refused(gateway: tuple[int, aioredis.Redis]) -> None:
    port, redis = gateway
    forever = jwt.encode({"sub": "b1"}, SECRET, "HS256")
    resp = await http_submit(f"http://127.0.0.1:{port}", _generate("noexp"), bearer=forever)
    assert resp.status_code == 401 and resp.json()["code"] == "AuthError"
    client = await Client(port, "b1", forever).connect()
    assert (await client.next())["code"] == "AuthError"
    assert not await redis.exists("aigcq:task:noexp")


async def test_an_http_backend_id_over_128_characters_is_refused(
    gateway: tuple[int, aioredis.Redis],
) -> None:
    port, redis = gateway
    before = await redis_snapshot(redis)
    resp = await http_submit(
        f"http://127.0.0.1:{port}", {**_generate("long"), "backendId": "b" * 500}
    )
    assert resp.status_code == 400 and resp.json()["code"] == "JSONError"
    assert "backendId" in resp.json()["detail"]
    assert await redis_snapshot(redis) == before


async def test_a_deeply_nested_client_frame_gets_an_error_and_the_socket_stays(
    gateway: tuple[int, aioredis.Redis],
) -> None:
    port, _redis = gateway
    client = await Client(port, "b1", token()).connect()
    reply = await client.request('{"type": "ping", "x": ' + "[" * 2000 + "]" * 2000 + "}")
    assert reply["type"] == "error" and reply["code"] == "JSONError"
    assert (await client.request({"type": "ping"}))["type"] == "pong"
    await client.close()
