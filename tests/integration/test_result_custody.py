"""Result custody (issue 28 item 5): a paid result's files copied into aigcq's storage
before delivery, served behind signed links that outlive the vendor's.

Real servers throughout: the RunningHub and JimuAI emulators (whose links expire on
demand), ``aigcq serve`` on 127.0.0.1, a real Redis, clients on the WebSocket and the
HTTP API."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.domain import Task, TaskState
from aigcq.emulators import jimuai, oss, runninghub
from aigcq.emulators._common import result_png
from aigcq.plumbing.redis_client import redis_client
from aigcq.serve.server import ServeProcess
from aigcq.wire.links import link_key, signed_url
from tests.fakes.client import Client, generate
from tests.fakes.servers import serve_app
from tests.fakes.waiting import until

TOKEN = "custody-client-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RH_KEY = "rh-key"
JPEG = b"\xff\xd8\xff"  # the JimuAI emulator serves JPEGs (emulators/jpeg.py)
AK, SK = "AKLTcustody", "custody-secret"
MODELS = {
    "proj": {
        "comfyui": {"apikey": RH_KEY, "concurrency": 5},
        "jimuai": {"access_key": AK, "secret_key": SK, "concurrency": 5, "req_key": "jimeng_t2i"},
    }
}


@dataclass
class Stack:
    service: ServeProcess
    base: str  # the service
    rh: str  # the RunningHub emulator
    jimu: str  # the JimuAI emulator
    oss: str  # the OSS file service emulator (the storage with AIGCQ_STORAGE_KIND=oss)
    http: httpx.AsyncClient

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    async def submit(self, task_id: str, backend_id: str, platform: str = "comfyui") -> None:
        """Submit over the HTTP API, its result for ``backend_id``'s outbox."""
        body = {**generate(task_id, platform), "backendId": backend_id}
        if platform == "jimuai":
            body["payload"] = {"prompt": "a fox"}
        answer = await self.http.post(f"{self.base}/api/tasks", json=body, headers=AUTH)
        assert answer.status_code == 202, answer.text

    async def task(self, task_id: str) -> Task:
        found = await self.service.rt.store.reads.get(task_id)
        assert found is not None
        return found

    async def done(self, task_id: str) -> Task:
        return await until(partial(self.task, task_id), lambda t: t.state.terminal, within=15)

    async def expire(self, emulator: str, which: Any) -> None:
        answer = await self.http.post(f"{emulator}/_emulator/files", json={"expire": which})
        assert answer.status_code == 200

    async def result_of(self, backend_id: str, task_id: str) -> dict[str, Any]:
        """The result message ``backend_id`` gets when it connects."""
        client = await Client(self.port, backend_id, TOKEN).connect()
        try:
            await client.collect(1, timeout=15)
        finally:
            await client.close()
        [message] = client.results[task_id]
        return message


def write_models(config_dir: Path) -> None:
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "model.json").write_text(json.dumps(MODELS))


@asynccontextmanager
async def stack(
    tmp_path: Path,
    redis: aioredis.Redis,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch | None = None,
    *,
    base64_only: bool = False,
    **settings: Any,
) -> AsyncIterator[Stack]:
    """The emulators and the service; ``monkeypatch``: its storage is the OSS service;
    ``base64_only``: JimuAI sends its images inline."""
    write_models(tmp_path)
    rh_config = runninghub.RunningHubEmulatorConfig(duration_s=0.3)
    jimu_config = jimuai.JimuAIEmulatorConfig(
        duration_s=0.3, credentials={AK: SK}, base64_only=base64_only
    )
    async with AsyncExitStack() as stack:
        rh = await stack.enter_async_context(serve_app(runninghub.create_app(rh_config)))
        jimu = await stack.enter_async_context(serve_app(jimuai.create_app(jimu_config)))
        oss_url = await stack.enter_async_context(serve_app(oss.create_app()))
        if monkeypatch is not None:
            monkeypatch.setenv("AIGCQ_STORAGE_KIND", "oss")
            monkeypatch.setenv("AIGCQ_STORAGE_OSS_URL", oss_url)
        s = Settings(
            redis_url=redis_url,
            token_secret="c" * 32,
            client_tokens=[TOKEN],
            config_dir=tmp_path,
            data_dir=tmp_path / "data",
            runninghub_url=rh,
            jimuai_url=jimu,
            sweep_interval_s=0.1,
            poll_interval_s=0.1,
            **settings,
        )
        own = redis_client(redis_url)
        stack.push_async_callback(own.aclose)
        service = ServeProcess(s, PlatformConfig.load(tmp_path), own)
        base = await stack.enter_async_context(serve_app(service.app))
        s.callback_url = base
        http = await stack.enter_async_context(httpx.AsyncClient())
        yield Stack(service, base, rh, jimu, oss_url, http)


def entry_of(message: dict[str, Any]) -> dict[str, Any]:
    assert message["status"] == "success", message
    [entry] = message["result"]["data"]
    assert message["data"] == message["result"]
    return entry  # type: ignore[no-any-return]


async def test_an_offline_clients_result_is_copied_and_outlives_the_vendors_link(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with stack(tmp_path, redis, redis_url) as env:
        await env.submit("t1", "away")  # "away" is not connected: the result waits offline
        task = await env.done("t1")
        await env.expire(env.rh, "all")  # a day later: RunningHub's link is gone
        entry = entry_of(await env.result_of("away", "t1"))
        source = entry["sourceUrl"]
        assert source.startswith(f"{env.rh}/files/{task.remote_id}/")
        assert (await env.http.get(source)).status_code == 404
        assert entry["fileUrl"].startswith(f"{env.base}/results/")
        assert time.time() + 3 * 86400 - 60 < entry["expiresAt"] <= time.time() + 3 * 86400
        assert "sourceExpiresAt" not in entry  # RunningHub's plain links do not say
        assert (entry["fileType"], entry["nodeId"]) == ("png", "9")  # the rest as it was
        copy = await env.http.get(entry["fileUrl"])
        assert copy.status_code == 200
        assert copy.content == result_png(task.remote_id)
        # the task's own record says the same
        stored = await env.http.get(f"{env.base}/api/tasks/t1", headers=AUTH)
        assert stored.json()["result"]["data"] == [entry]


async def test_a_connected_client_gets_the_vendors_link_by_default(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with stack(tmp_path, redis, redis_url) as env:
        client = await Client(env.port, "here", TOKEN).connect()
        try:
            await client.request(generate("t1"))
            await client.collect(1, timeout=15)
        finally:
            await client.close()
        entry = entry_of(client.results["t1"][0])
        assert entry["fileUrl"].startswith(f"{env.rh}/files/")
        assert "sourceUrl" not in entry


async def test_forged_expired_and_missing_links_are_refused_with_a_code(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with stack(tmp_path, redis, redis_url) as env:
        await env.submit("t1", "away")
        await env.done("t1")
        url = entry_of(await env.result_of("away", "t1"))["fileUrl"]
        token, name = url.removeprefix(f"{env.base}/results/").split("/", 1)
        expires, signature = token.split("-")
        forged = f"{env.base}/results/{expires}-{'0' * len(signature)}/{name}"
        later = f"{env.base}/results/{int(expires) + 1}-{signature}/{name}"
        other = f"{env.base}/results/{token}/{name.replace('/0.', '/1.')}"
        for refused in (forged, later, other, f"{env.base}/results/x/{name}"):
            answer = await env.http.get(refused)
            assert answer.status_code == 403, refused
            assert answer.json()["code"] == "SignatureError"
            assert answer.json()["msg"] == "签名校验失败。"
        key = link_key(env.service.rt.settings.signing_key())
        past = signed_url(env.base, key, name, int(time.time()) - 1)
        answer = await env.http.get(past)
        assert (answer.status_code, answer.json()["code"]) == (410, "LinkExpired")
        assert answer.json()["msg"] == "链接已过期。"
        gone = signed_url(env.base, key, "custody/nothing/0.png", int(time.time()) + 60)
        answer = await env.http.get(gone)
        assert (answer.status_code, answer.json()["code"]) == (404, "FileNotFound")
        # the copies are not served unsigned beside the inline result files
        assert (await env.http.get(f"{env.base}/files/{name}")).status_code == 404
        assert (await env.http.get(url)).status_code == 200


async def test_a_copy_failing_on_an_expired_vendor_link_still_delivers_the_result(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, caplog: Any
) -> None:
    async with stack(tmp_path, redis, redis_url) as env:
        await env.submit("t1", "away")
        running = await until(partial(env.task, "t1"), lambda t: bool(t.remote_id), within=15)
        await env.expire(env.rh, [running.remote_id])  # gone before we could copy it
        assert (await env.done("t1")).state is TaskState.SUCCESS
        entry = entry_of(await env.result_of("away", "t1"))
        assert entry["fileUrl"] == entry["sourceUrl"]
        assert entry["fileUrl"].startswith(f"{env.rh}/files/{running.remote_id}/")
        assert entry["custodyError"] == "HTTP 404"
        assert "expiresAt" not in entry
    lines = [r.getMessage() for r in caplog.records if "not copied" in r.getMessage()]
    assert lines == [
        f"task t1: result file 0 not copied (HTTP 404); delivered with the vendor's link "
        f"{entry['sourceUrl']}"
    ]


async def test_jimuai_links_expiry_is_recorded_and_an_expired_one_answers_403(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with stack(tmp_path, redis, redis_url) as env:
        await env.submit("j1", "away", platform="jimuai")
        await env.done("j1")
        entry = entry_of(await env.result_of("away", "j1"))
        expires = int(parse_qs(urlsplit(entry["sourceUrl"]).query)["x-expires"][0])
        assert entry["sourceExpiresAt"] == expires
        await env.expire(env.jimu, "all")
        assert (await env.http.get(entry["sourceUrl"])).status_code == 403
        copy = await env.http.get(entry["fileUrl"])
        assert copy.content.startswith(JPEG)  # JimuAI's documented format, as its fileType says
        assert urlsplit(entry["fileUrl"]).path.endswith(".jpeg")

        await env.submit("j2", "away", platform="jimuai")
        running = await until(partial(env.task, "j2"), lambda t: bool(t.remote_id), within=15)
        await env.expire(env.jimu, [running.remote_id])
        await env.done("j2")
        failed = entry_of(await env.result_of("away", "j2"))
        assert (failed["custodyError"], failed["fileUrl"]) == ("HTTP 403", failed["sourceUrl"])


async def test_always_copies_for_a_connected_client_and_off_never(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with stack(tmp_path / "always", redis, redis_url, result_custody="always") as env:
        client = await Client(env.port, "here", TOKEN).connect()
        try:
            await client.request(generate("t1"))
            await client.collect(1, timeout=15)
        finally:
            await client.close()
        entry = entry_of(client.results["t1"][0])
        assert entry["fileUrl"].startswith(f"{env.base}/results/")
        assert (await env.http.get(entry["fileUrl"])).status_code == 200
    await redis.flushall()
    async with stack(tmp_path / "off", redis, redis_url, result_custody="off") as env:
        await env.submit("t2", "away")
        await env.done("t2")
        entry = entry_of(await env.result_of("away", "t2"))
        assert entry["fileUrl"].startswith(f"{env.rh}/files/")
        assert "sourceUrl" not in entry


async def test_a_client_counts_as_offline_once_its_socket_closed(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with stack(tmp_path, redis, redis_url) as env:
        presence = env.service.custody.presence
        client = await Client(env.port, "b1", TOKEN).connect()
        await until(partial(presence.online, "b1"), bool)
        newer = await Client(env.port, "b1", TOKEN).connect()  # replaces the first
        await client.close()
        await asyncio.sleep(0.2)  # the replaced socket's end must not count the client out
        assert await presence.online("b1")
        await newer.close()
        await until(partial(presence.online, "b1"), lambda online: not online)


async def test_copies_in_the_oss_service_are_reached_through_their_signed_links(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with stack(tmp_path, redis, redis_url, monkeypatch) as env:
        await env.submit("t1", "away")
        task = await env.done("t1")
        entry = entry_of(await env.result_of("away", "t1"))
        answer = await env.http.get(entry["fileUrl"])
        assert answer.status_code == 307
        assert answer.headers["location"].startswith(f"{env.oss}/oss/file/")
        copy = await env.http.get(entry["fileUrl"], follow_redirects=True)
        assert copy.content == result_png(task.remote_id)
        # the service refusing a copy: the result goes with the vendor's link
        await env.http.post(f"{env.oss}/_emulator/config", json={"mode": "down"})
        await env.submit("t2", "away")
        await env.done("t2")
        entry = entry_of(await env.result_of("away", "t2"))
        assert entry["fileUrl"] == entry["sourceUrl"]
        assert entry["custodyError"].startswith("storage: OSS upload")


async def test_local_copies_are_deleted_once_their_links_expired(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    # links live 5 s: long enough for the first fetch on a loaded host
    async with stack(tmp_path, redis, redis_url, result_link_ttl_s=5) as env:
        await env.submit("t1", "away")
        await env.done("t1")
        url = entry_of(await env.result_of("away", "t1"))["fileUrl"]
        assert (await env.http.get(url)).status_code == 200
        name = url.removeprefix(f"{env.base}/results/").split("/", 1)[1]
        await until(env.service.custody.sweep, lambda removed: removed == 1, within=20)
        key = link_key(env.service.rt.settings.signing_key())
        fresh = signed_url(env.base, key, name, int(time.time()) + 60)
        answer = await env.http.get(fresh)
        assert (answer.status_code, answer.json()["code"]) == (404, "FileNotFound")
        assert not any((tmp_path / "data" / "files" / "custody").rglob("*"))  # folders too


async def test_images_a_platform_sent_inline_are_stored_once_not_copied_again(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with stack(tmp_path, redis, redis_url, base64_only=True) as env:
        await env.submit("j1", "away", platform="jimuai")
        await env.done("j1")
        entry = entry_of(await env.result_of("away", "j1"))
        # the storage's own link (its base was fixed before this test knew its port)
        path = urlsplit(entry["fileUrl"]).path
        assert path.startswith("/files/platforms/jimuai/")
        assert "sourceUrl" not in entry
        assert (await env.http.get(f"{env.base}{path}")).content.startswith(JPEG)
