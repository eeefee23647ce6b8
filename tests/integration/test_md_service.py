"""The message-dispatcher in-process against a real Redis: login, JWT, ``/api/task``, the
RunningHub-compatible routes driven by our ``runninghub`` adapter, and webhook delivery."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import jwt
import orjson
import pytest
import redis.asyncio as aioredis

from aigcq.dispatcher.auth import DispatcherAuth
from aigcq.domain import Task
from aigcq.platforms.base import Accepted, NotFound, Pending, Rejected, Succeeded
from aigcq.platforms.md_auth import JwtManager
from aigcq.platforms.runninghub import RunningHubAdapter
from aigcq.plumbing.auth import issue_client_token
from tests.fakes.bridge import Bridge
from tests.fakes.client import generate
from tests.fakes.message_dispatcher import (
    BODY,
    JWT_SECRET,
    LOGIN,
    PASSWORD,
    Md,
    fast_checks,
    md,
    md_task_end,
    serve_split,
    serve_split_with_runninghub,
)
from tests.fakes.servers import Recorder, send, serve_app, stream_until_answered
from tests.fakes.snapshot import redis_snapshot
from tests.fakes.waiting import until, wait_until

__all__ = ["fast_checks", "md"]  # fixtures: imported for pytest to find


async def test_login_issues_a_24h_token_and_refuses_bad_credentials(md: Md) -> None:
    ok = await md.http.post("/api/auth/login", json=LOGIN)
    assert ok.status_code == 200 and ok.json()["success"] is True
    data = ok.json()["data"]
    assert data["access_token"] and data["expires_in"] == 86400 and data["expires_at"] > 0
    wrong = await md.http.post("/api/auth/login", json={**LOGIN, "password": "nope"})
    assert wrong.status_code == 401 and wrong.json()["success"] is False
    malformed = await md.http.post("/api/auth/login", content=b"{not json")
    assert malformed.status_code == 400


async def test_task_is_queued_without_its_api_key(md: Md) -> None:
    token = await md.token()
    resp = await md.http.post("/api/task", json={**BODY, "apiKey": token})
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert resp.json()["success"] is True and data["requestId"] == data["taskId"]
    task = await md.task(data["taskId"])
    assert task is not None and task.state == "pending" and task.platform == "comfyui"
    assert task.payload == BODY  # apiKey dropped, the rest as sent


async def test_the_seeds_snake_case_body_is_read_as_camel_case(md: Md) -> None:
    """The original system's own example body: ``workflow_id``, ``node_info_list``."""
    token = await md.token()
    body = {
        "workflow_id": "123",
        "node_info_list": [{"node_id": "6", "field_name": "text", "field_value": "a cat"}],
        "apiKey": token,
        "webhookUrl": "http://callback-url",
    }
    resp = await md.http.post("/api/task", json=body)
    assert resp.status_code == 200, resp.text
    task = await md.task(resp.json()["data"]["taskId"])
    assert task is not None and task.payload == {
        "workflowId": "123",
        "nodeInfoList": [{"nodeId": "6", "fieldName": "text", "fieldValue": "a cat"}],
        "webhookUrl": "http://callback-url",
    }
    rh = await md.http.post("/task/openapi/create", json=body)
    assert rh.json()["code"] == 0, rh.text


@pytest.mark.parametrize(
    "api_key",
    [None, "", "garbage", "expired", "client-token", "no-exp"],
)
async def test_bad_tokens_get_401_and_queue_nothing(md: Md, api_key: str | None) -> None:
    if api_key == "no-exp":  # issue 15 item 14: a token that would never expire
        claims = {"sub": "admin", "aud": "aigcq-message-dispatcher"}
        api_key = jwt.encode(claims, JWT_SECRET, "HS256")
    elif api_key == "expired":
        api_key = DispatcherAuth("admin", PASSWORD, JWT_SECRET, -10).login("admin", PASSWORD)
        api_key = api_key.access_token if api_key else None
    elif api_key == "client-token":  # signed with the same secret, but not a login token
        api_key = issue_client_token(JWT_SECRET, "admin")
    before = await redis_snapshot(md.redis)
    body = {**BODY, **({"apiKey": api_key} if api_key is not None else {})}
    resp = await md.http.post("/api/task", json=body)
    assert resp.status_code == 401 and resp.json()["success"] is False
    rh = await md.http.post("/task/openapi/create", json=body)
    assert rh.json()["code"] == 802
    assert await redis_snapshot(md.redis) == before


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2]",
        orjson.dumps({"nodeInfoList": []}),  # neither workflowId nor workflow
        orjson.dumps({**BODY, "nodeInfoList": [{"nodeId": 6}]}),
        orjson.dumps({**BODY, "webhookUrl": "ftp://x"}),
        orjson.dumps({**BODY, "workflow_id": "other"}),  # two spellings, two values
    ],
)
async def test_malformed_bodies_get_400_and_queue_nothing(md: Md, body: bytes) -> None:
    headers = {"Authorization": f"Bearer {await md.token()}"}
    before = await redis_snapshot(md.redis)
    resp = await md.http.post("/api/task", content=body, headers=headers)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "InvalidBody"
    assert await redis_snapshot(md.redis) == before


async def test_health_counts_bridges_and_free_slots(md: Md) -> None:
    empty = (await md.http.get("/api/health")).json()["data"]
    assert empty["bridges"] == 0 and empty["freeSlots"] == 0
    bridge = await Bridge.connect(md.port)
    await bridge.register(count=3)
    data = await until(
        lambda: _health(md), lambda d: d["bridges"] == 1 and d["instances"] == 3, within=5
    )
    assert data["healthy"] and data["freeSlots"] == 3
    overview = await md.http.get("/api/overview")
    assert overview.status_code == 401
    headers = {"Authorization": f"Bearer {await md.token()}"}
    view = (await md.http.get("/api/overview", headers=headers)).json()["data"]
    assert view["bridgeList"][0]["bridgeId"] == "br1" and "recentTasks" in view
    await bridge.ws.close()


async def _health(md: Md) -> dict[str, Any]:
    data: dict[str, Any] = (await md.http.get("/api/health")).json()["data"]
    return data


async def test_runninghub_adapter_end_to_end_with_webhook(md: Md) -> None:
    """Our ``runninghub`` adapter pointed at the dispatcher: create, query, TASK_END."""
    recorder = Recorder(fail_first=1)  # the first delivery fails: it is retried
    token = await md.token()
    rh = RunningHubAdapter(md.base)
    bridge = await Bridge.connect(md.port)
    await bridge.register(count=1)
    async with serve_app(recorder.app) as hook_base:
        task = Task("client-1", "comfyui", "img", "b1", dict(BODY))
        status, body = await send(md.http, rh.submit_request(task, token, f"{hook_base}/hook"))
        accepted = rh.parse_submit(status, body)
        assert isinstance(accepted, Accepted)
        remote = Task("client-1", "comfyui", "img", "b1", {}, remote_id=accepted.remote_id)
        assign = await bridge.next()
        assert (
            assign["type"] == "TASK_ASSIGN" and assign["data"]["workflowId"] == BODY["workflowId"]
        )
        await bridge.ack(assign["data"]["taskId"])
        assert rh.parse_query(*await send(md.http, rh.query_request(remote, token))) == Pending(
            "RUNNING"
        )
        await md_task_end(md, assign["data"]["webhookUrl"])
        received = await recorder.wait_for(2, within=10)
        event = received[-1].json()
        assert received[-1].path == "/hook" and event["taskId"] == accepted.remote_id
        assert isinstance(rh.parse_result(event), Succeeded)
        outcome = rh.parse_query(*await send(md.http, rh.query_request(remote, token)))
        assert isinstance(outcome, Succeeded)
        status_req = rh.query_request(remote, token)
        status_url = status_req.url.replace("/outputs", "/status")
        assert (await md.http.post(status_url, json=status_req.json)).json()["data"] == "SUCCESS"
    unknown = Task("x", "comfyui", "img", "b1", {}, remote_id="no-such-task")
    assert isinstance(
        rh.parse_query(*await send(md.http, rh.query_request(unknown, token))), NotFound
    )
    refused = rh.parse_submit(*await send(md.http, rh.submit_request(task, "bad", "")))
    assert isinstance(refused, Rejected) and refused.code == "RH_802"
    account = await md.http.post("/uc/openapi/accountStatus", json={"apikey": token})
    assert account.json()["code"] == 0
    await bridge.ws.close()


async def test_cancel_finishes_the_task_and_tells_the_webhook(md: Md) -> None:
    recorder = Recorder()
    token = await md.token()
    async with serve_app(recorder.app) as hook_base:
        body = {**BODY, "apiKey": token, "webhookUrl": f"{hook_base}/hook"}
        task_id = (await md.http.post("/task/openapi/create", json=body)).json()["data"]["taskId"]
        cancel = {"apiKey": token, "taskId": task_id}
        assert (await md.http.post("/task/openapi/cancel", json=cancel)).json()["code"] == 0
        event = (await recorder.wait_for(1, within=5))[0].json()
        assert event["taskId"] == task_id
        assert orjson.loads(event["eventData"])["code"] == 805
    task = await md.task(task_id)
    assert task is not None and task.state == "cancelled"


# ---- the split topology: aigcq serve -> message-dispatcher -> bridge ---------------------


@pytest.mark.usefixtures("fast_checks")
async def test_split_topology_end_to_end(
    md: Md, tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    bridge = await Bridge.connect(md.port)
    await bridge.register(count=1)
    async with serve_split(tmp_path, redis, redis_url, md.base) as (service, client):
        reply = await client.request(generate("split-1"))
        assert reply["type"] != "error", reply
        assign = await bridge.next(timeout=10)
        assert assign["type"] == "TASK_ASSIGN"
        md_task_id = assign["data"]["taskId"]
        await bridge.ack(md_task_id)
        task = await until(
            lambda: service.rt.store.reads.get("split-1"),
            lambda t: t is not None and t.state == "running",
        )
        assert task is not None and task.target == "message_dispatcher"
        assert task.remote_id == md_task_id
        await md_task_end(md, assign["data"]["webhookUrl"])
        result = await client.next(timeout=10)
        assert result["type"] == "result" and result["taskId"] == "split-1"
        assert result["status"] == "success", result
    await bridge.ws.close()


@pytest.mark.usefixtures("fast_checks")
async def test_unreachable_dispatcher_overflows_to_runninghub(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with serve_split_with_runninghub(
        tmp_path, redis, redis_url, "http://127.0.0.1:9", duration_s=0.1
    ) as (service, client):
        await client.request(generate("over-1"))
        result = await client.next(timeout=10)
        assert result["type"] == "result" and result["status"] == "success", result
        task = await service.rt.store.reads.get("over-1")
        assert task is not None and task.target == "runninghub"


async def test_short_lived_token_is_renewed_before_it_expires(md: Md) -> None:
    md.dispatcher.auth.ttl_s = 2
    manager = JwtManager(md.base, "admin", PASSWORD, refresh_ahead_s=3600)
    runner = asyncio.create_task(manager.run())
    try:
        first = await wait_until(manager.current)
        seen = {first}
        for _ in range(80):  # 4 s: two lifetimes, the token is never missing
            token = manager.current()
            assert token is not None
            seen.add(token)
            await asyncio.sleep(0.05)  # time: sampled every 50 ms, never missing
        assert len(seen) >= 3
        resp = await md.http.post("/api/task", json={**BODY, "apiKey": manager.current()})
        assert resp.status_code == 200
    finally:
        runner.cancel()


async def test_login_is_retried_until_it_succeeds(md: Md, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="aigcq")
    manager = JwtManager(md.base, "admin", "wrong", refresh_ahead_s=3600, max_backoff_s=0.2)
    runner = asyncio.create_task(manager.run())
    try:
        await wait_until(lambda: "login failed (attempt 2)" in caplog.text)  # refused twice
        assert manager.current() is None  # refused, retrying; dispatch is never blocked
        manager.password = PASSWORD
        await wait_until(manager.current, 3)
    finally:
        runner.cancel()


async def test_openapi_describes_the_dispatchers_own_routes(md: Md) -> None:
    from aigcq.dispatcher.openapi_doc import PATHS

    schema = (await md.http.get("/openapi.json")).json()
    assert schema["info"]["title"] == "aigcq message-dispatcher"
    own = {route.path for route in md.dispatcher.api.routes()}
    assert own == set(PATHS) and own <= set(schema["paths"])
    create = schema["paths"]["/api/task"]["post"]
    assert "workflowId" in create["requestBody"]["content"]["application/json"]["schema"][
        "properties"
    ] and {"200", "400", "401"} == set(create["responses"])
    bridges, feed = schema["paths"]["/ws"]["get"], schema["paths"]["/ws/capacity"]["get"]
    assert bridges["security"] == [{"bridgeToken": []}, {}] and "101" in feed["responses"]


async def test_create_answers_as_runninghub_does(md: Md) -> None:
    """runninghub-sdk reads clientId and promptTips (a JSON string) from the create reply."""
    reply = (
        await md.http.post("/task/openapi/create", json={**BODY, "apiKey": await md.token()})
    ).json()
    assert reply["code"] == 0, reply
    assert set(reply["data"]) == {"taskId", "taskStatus", "clientId", "netWssUrl", "promptTips"}
    assert orjson.loads(reply["data"]["promptTips"])["result"] is True


HUGE = 32 << 20  # issue 15 item 13: a chunked body no route may buffer whole


@pytest.mark.parametrize(
    ("target", "bearer", "status"),
    [
        ("/api/auth/login", "", 413),
        ("/api/task", "forged", 401),
        ("/api/task", "valid", 413),
        ("/task/openapi/create", "", 413),
    ],
)
async def test_a_huge_chunked_body_is_refused_while_it_is_still_being_sent(
    md: Md, target: str, bearer: str, status: int
) -> None:
    token = await md.token() if bearer == "valid" else bearer
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    before = await redis_snapshot(md.redis)
    upload = await stream_until_answered(md.base, "POST", target, headers, HUGE)
    assert upload.status == status
    assert upload.sent < HUGE
    assert await redis_snapshot(md.redis) == before
