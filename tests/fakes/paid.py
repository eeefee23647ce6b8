"""An in-process ``aigcq serve`` with recording RunningHub and Coze emulators in front of
it, for the paid-platform fault tests (issue 15): at most one paid run per task, never
above an account's cap, every unwanted remote task cancelled."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.domain import Task, TaskState
from aigcq.emulators import coze, jimuai, runninghub
from aigcq.emulators._records import paid_runs
from aigcq.plumbing.redis_client import redis_client
from aigcq.plumbing.signing import webhook_url
from aigcq.serve.server import ServeProcess
from tests.fakes.client import Client, generate
from tests.fakes.servers import serve_app
from tests.fakes.waiting import until

TOKEN = "paid-client-token"
RH_KEY = "rh-key"
COZE_KEY = "pat-key"
JIMU_AK, JIMU_SK = "AKLTpaid", "paid-jimu-secret"


@dataclass
class Paid:
    service: ServeProcess
    client: Client
    base: str  # the service
    urls: dict[str, str]  # emulator base URL by platform ("runninghub", "coze")

    async def _call(self, platform: str, method: str, path: str, body: Any = None) -> Any:
        async with httpx.AsyncClient(base_url=self.urls[platform]) as http:
            return (await http.request(method, path, json=body)).json()

    async def records(self, platform: str = "runninghub") -> dict[str, Any]:
        """``/_emulator/records`` of one emulator (per API key)."""
        found: dict[str, Any] = await self._call(platform, "GET", "/_emulator/records")
        return found

    async def faults(self, platform: str = "runninghub", **faults: Any) -> None:
        await self._call(platform, "POST", "/_emulator/faults", faults)

    async def inject(self, kind: str, count: int = 1) -> None:
        """The JimuAI emulator's next ``count`` answers of ``kind`` (``/_emulator/inject``)."""
        await self._call("jimuai", "POST", "/_emulator/inject", {"kind": kind, "count": count})

    async def jimu_stats(self) -> dict[str, Any]:
        found: dict[str, Any] = await self._call("jimuai", "GET", "/_emulator/stats")
        return found

    async def creates(self, task_id: str, platform: str = "runninghub") -> list[dict[str, Any]]:
        records = await self.records(platform)
        return [c for rec in records.values() for c in rec["creates"] if c["task"] == task_id]

    async def double_paid(self, platform: str = "runninghub") -> dict[str, int]:
        return {t: n for t, n in paid_runs(await self.records(platform)).items() if n > 1}

    async def task(self, task_id: str) -> Task:
        task = await self.service.rt.store.reads.get(task_id)
        assert task is not None
        return task

    async def cancel_running(self, task_id: str) -> None:
        """Submit ``task_id``, wait until it runs on RunningHub, cancel it (as an admin)."""
        await self.client.request(generate(task_id))
        await until(partial(self.task, task_id), lambda t: t.state is TaskState.RUNNING)
        await self.service.gateway.cancel(task_id, None)

    async def runs_alone(self, task_id: str) -> None:
        """Submit ``task_id``; once RunningHub created it, it never ran beside another."""
        await self.client.request(generate(task_id))
        await until(partial(self.creates, task_id), bool, within=15)
        records = (await self.records())[RH_KEY]
        assert records["peak"] == 1, records

    async def post_task_end(
        self, task_id: str, attempt: int, event_data: dict[str, Any], *, here: bool = False
    ) -> int:
        """POST a RunningHub TASK_END to the signed URL of ``attempt`` (``here``: to this
        service, whatever public callback URL it hands out)."""
        url = self.service.rt.webhook_url(task_id, attempt)
        if here:
            url = webhook_url(self.base, self.service.rt.settings.signing_key(), task_id, attempt)
        body = {"event": "TASK_END", "taskId": "x", "eventData": json.dumps(event_data)}
        async with httpx.AsyncClient() as http:
            return (await http.post(url, json=body)).status_code


def jimuai_account(concurrency: int = 5, **account: Any) -> dict[str, Any]:
    """model.json's ``jimuai`` entry for the emulator :func:`paid_stack` starts with ``jm``."""
    keys = {"access_key": JIMU_AK, "secret_key": JIMU_SK, "req_key": "jimeng_t2i_v40"}
    return {**keys, "concurrency": concurrency, **account}


def jimuai_config(**options: Any) -> jimuai.JimuAIEmulatorConfig:
    return jimuai.JimuAIEmulatorConfig(
        **{"duration_s": 0.1, "credentials": {JIMU_AK: JIMU_SK}, **options}
    )


def models(concurrency: int = 5, **account: Any) -> dict[str, Any]:
    """model.json: project ``proj`` on RunningHub (comfyui) and Coze, one account each."""
    return {
        "proj": {
            "comfyui": {"apikey": RH_KEY, "concurrency": concurrency, **account},
            "coze": {"apikey": COZE_KEY, "concurrency": concurrency, **account},
        }
    }


@asynccontextmanager
async def paid_stack(
    tmp_path: Path,
    redis: aioredis.Redis,
    redis_url: str,
    *,
    model: dict[str, Any] | None = None,
    rh: runninghub.RunningHubEmulatorConfig | None = None,
    cz: coze.CozeEmulatorConfig | None = None,
    jm: jimuai.JimuAIEmulatorConfig | None = None,
    **settings: Any,
) -> AsyncIterator[Paid]:
    """Emulators (JimuAI's only with ``jm``), the service (webhooks come back to it unless
    ``callback_url`` is given) and a connected client."""
    (tmp_path / "model.json").write_text(json.dumps(model or models()))
    rh_config = rh or runninghub.RunningHubEmulatorConfig(duration_s=0.2)
    cz_config = cz or coze.CozeEmulatorConfig(duration_s=0.2)
    async with AsyncExitStack() as stack:
        rh_url = await stack.enter_async_context(serve_app(runninghub.create_app(rh_config)))
        cz_url = await stack.enter_async_context(serve_app(coze.create_app(cz_config)))
        urls = {"runninghub": rh_url, "coze": cz_url}
        if jm is not None:
            urls["jimuai"] = await stack.enter_async_context(serve_app(jimuai.create_app(jm)))
        options = {
            "runninghub_url": rh_url,
            "coze_url": cz_url,
            **({"jimuai_url": urls["jimuai"]} if jm is not None else {}),
            "sweep_interval_s": 0.1,
            "poll_interval_s": 0.2,
            "full_backoff_s": 0.05,
            **settings,
        }
        s = Settings(
            redis_url=redis_url,
            token_secret="t" * 32,
            client_tokens=[TOKEN],
            config_dir=tmp_path,
            data_dir=tmp_path / "data",
            **options,
        )
        # the service's own client, as in production (the fixture's pool is not blocking)
        own = redis_client(redis_url)
        stack.push_async_callback(own.aclose)
        service = ServeProcess(s, PlatformConfig.load(tmp_path), own)
        base = await stack.enter_async_context(serve_app(service.app))
        if "callback_url" not in settings:
            s.callback_url = base
        client = await Client(int(base.rsplit(":", 1)[1]), "b1", TOKEN).connect()
        try:
            yield Paid(service, client, base, urls)
        finally:
            await client.close()
            await asyncio.sleep(0)  # a loop turn: the server handles the close before exit


@asynccontextmanager
async def serve_beside(env: Paid, tmp_path: Path, name: str = "second") -> AsyncIterator[Paid]:
    """Another serve process on the same Redis and emulators, with the same settings (its
    own data folder), and a client of its own connected to it."""
    settings = env.service.rt.settings.model_copy(update={"data_dir": tmp_path / name})
    async with AsyncExitStack() as stack:
        own = redis_client(settings.redis_url)
        stack.push_async_callback(own.aclose)
        service = ServeProcess(settings, env.service.rt.config, own)
        base = await stack.enter_async_context(serve_app(service.app))
        client = await Client(int(base.rsplit(":", 1)[1]), f"{name}-client", TOKEN).connect()
        stack.push_async_callback(client.close)
        yield Paid(service, client, base, env.urls)


async def created(env: Paid, task_id: str, n: int = 1, platform: str = "runninghub") -> None:
    """Until RunningHub (or ``platform``) has ``n`` creates of ``task_id``."""
    await until(partial(env.creates, task_id, platform), lambda c: len(c) >= n, within=15)


async def expire_now(env: Paid, task_id: str) -> None:
    """Let time pass for one task: its deadline is now (what a long wait would do)."""
    keys = env.service.rt.store.keys
    await env.service.rt.redis.hset(keys.task(task_id), "deadline", 1)
    await env.service.rt.redis.zadd(keys.inflight, {task_id: 1}, xx=True)
