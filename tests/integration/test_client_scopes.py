"""A client token names exactly the ids it may use, and its quota is its principal's (issue 42
items 4 and 5), against a real Redis and the app on 127.0.0.1: a JWT for ``acme`` cannot
connect as ``acme-cn`` (a different client), take its results, cancel or read its tasks,
nor list them; one minted for both ids may; fresh ids do not bypass a quota."""

from __future__ import annotations

from pathlib import Path

import httpx
import redis.asyncio as aioredis

from aigcq.plumbing.auth import issue_client_token
from tests.fakes.client import Client, generate
from tests.fakes.gateway import SECRET, STATIC, Server, serve, token
from tests.fakes.snapshot import redis_snapshot

BOTH = issue_client_token(SECRET, "acme", ids=["acme-cn"])  # `aigcq token acme --id acme-cn`


def client_of(server: Server) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.base)


def bearer(jwt: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {jwt}"}


async def test_a_token_for_one_client_cannot_act_as_another(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with serve(tmp_path, redis, redis_url) as server, client_of(server) as http:
        owner = await Client(server.port, "acme-cn", token("acme-cn")).connect()
        assert (await owner.request(generate("cn-1", aigc="proj")))["type"] == "submitted"
        await owner.close()
        before = await redis_snapshot(server.redis)
        # acme's token, as acme-cn: refused, nothing taken (its outbox, its presence)
        stranger = await Client(server.port, "acme-cn", token("acme")).connect()
        refusal = await stranger.next()
        assert (refusal["type"], refusal["code"]) == ("error", "AuthError"), refusal
        assert "aigcq token acme --id acme-cn" in refusal["detail"], refusal
        await stranger.ws.wait_closed()
        assert stranger.ws.close_code == 4401
        acme = bearer(token("acme"))
        body = {**generate("cn-2", aigc="proj"), "backendId": "acme-cn"}
        submitted = await http.post("/api/tasks", json=body, headers=acme)
        assert (submitted.status_code, submitted.json()["code"]) == (401, "AuthError")
        for answer in (
            await http.post("/api/tasks/cn-1/cancel", headers=acme),
            await http.get("/api/tasks/cn-1", headers=acme),
        ):
            assert (answer.status_code, answer.json()["code"]) == (404, "TaskNotFound")
        assert await redis_snapshot(server.redis) == before
        # a token that names both ids may do all of it
        both = await Client(server.port, "acme-cn", BOTH).connect()
        assert (await both.request({"type": "ping"}))["type"] == "pong"
        await both.close()
        assert (await http.get("/api/tasks/cn-1", headers=bearer(BOTH))).status_code == 200
        done = await http.post("/api/tasks/cn-1/cancel", headers=bearer(BOTH))
        assert done.json() == {"taskId": "cn-1", "state": "cancelled"}, done.text


async def test_a_client_lists_only_the_tasks_of_its_ids(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with serve(tmp_path, redis, redis_url) as server, client_of(server) as http:
        for backend_id in ("acme", "acme-cn", "other"):
            client = await Client(server.port, backend_id, token(backend_id)).connect()
            await client.request(generate(f"{backend_id}-t", aigc="proj"))
            await client.request({"type": "cancel", "taskId": f"{backend_id}-t"})  # finished
            await client.close()

        async def listed(headers: dict[str, str]) -> set[str]:
            resp = await http.get("/api/tasks", headers=headers)
            assert resp.status_code == 200, resp.text
            return {t["taskId"] for t in resp.json()}

        assert await listed(bearer(token("acme"))) == {"acme-t"}
        assert await listed(bearer(BOTH)) == {"acme-t", "acme-cn-t"}
        assert await listed(bearer("admin")) == {"acme-t", "acme-cn-t", "other-t"}
        assert await listed(bearer(STATIC)) == {"acme-t", "acme-cn-t", "other-t"}
        one = await http.get("/api/tasks", params={"limit": 1}, headers=bearer(BOTH))
        assert len(one.json()) == 1


async def test_a_quota_is_the_principals_whichever_ids_it_uses(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    overrides = {"admission": "quota", "admission_quota": 2, "bind_client_ids": "off"}
    async with serve(tmp_path, redis, redis_url, **overrides) as server, client_of(server) as http:
        for credential in (token("acme"), STATIC):  # unbound: any id, one quota
            queued = []
            for i in range(4):
                backend_id = f"fresh-{i}-{credential[-6:]}"
                client = await Client(server.port, backend_id, credential).connect()
                reply = await client.request(generate(f"{backend_id}-t", aigc="proj"))
                queued.append(reply["type"] == "submitted")
                await client.close()
            before = await redis_snapshot(server.redis)
            body = {**generate("http-t", aigc="proj"), "backendId": "fresh-http"}
            refused = await http.post("/api/tasks", json=body, headers=bearer(credential))
            assert (refused.status_code, refused.json()["code"]) == (402, "BalanceError")
            assert await redis_snapshot(server.redis) == before
            assert queued == [True, True, False, False], (credential, queued)
