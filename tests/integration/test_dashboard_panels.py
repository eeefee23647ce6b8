"""The dashboard's extra panels: overflow spend (per process, from the metrics counters that
each paid task's recorded cost adds to), the model-asynch panel (only with
``AIGCQ_ASYNCH_URL``), and ``aigcq dispatcher``'s own ``/dashboard``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from aigcq.config import PlatformConfig, Settings
from aigcq.dispatcher.process import MessageDispatcher, core_settings
from aigcq.dispatcher.settings import DispatcherSettings
from aigcq.observability import metrics
from aigcq.serve.server import ServeProcess
from tests.fakes.asynch import OVERVIEW, fake_asynch
from tests.fakes.servers import serve_app
from tests.fakes.waiting import until

ADMIN = "panels-admin-token"
HEADERS = {"Authorization": f"Bearer {ADMIN}"}


def service(tmp_path: Path, redis: aioredis.Redis, redis_url: str, **extra: Any) -> ServeProcess:
    (tmp_path / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k", "concurrency": 1}}}')
    settings = Settings(
        redis_url=redis_url,
        token_secret="s" * 40,
        config_dir=tmp_path,
        admin_token=ADMIN,
        overflow_price={"runninghub": 0.25},
        **extra,
    )
    return ServeProcess(settings, PlatformConfig.load(tmp_path), redis)


async def snapshot(base: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base) as http:
        r = await http.get("/api/admin/snapshot", headers=HEADERS)
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body


def spend(snap: dict[str, Any], target: str) -> tuple[int, float]:
    row = next((r for r in snap["overflow"]["targets"] if r["target"] == target), None)
    return (row["tasks"], row["cost"]) if row else (0, 0.0)


async def test_overflow_spend_follows_the_metrics_and_no_asynch_panel(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    svc = service(tmp_path, redis, redis_url)
    async with serve_app(svc.app) as base:
        first = await snapshot(base)
        assert first["asynch"] is None and first["overflow"]["scope"] == "process"
        tasks, cost = spend(first, "runninghub")
        for _ in range(3):
            metrics.overflowed("proj", "comfyui", "runninghub")
            metrics.spent("proj", "runninghub", "acct", 0.25, estimate=True, coins=0)
        metrics.spent("proj", "runninghub", "acct", 0.35, estimate=False, coins=12)  # its money
        # The monitor samples every second; the snapshot endpoint serves the latest.
        later = await until(
            lambda: snapshot(base),
            lambda snap: spend(snap, "runninghub")[0] == tasks + 3,
            within=5.0,
            interval=0.1,
        )
        assert spend(later, "runninghub") == (tasks + 3, pytest.approx(cost + 1.1))
        assert later["overflow"]["totalCost"] >= 1.1
        # of the cost, what the platform reported and what its price estimates
        for figure, added in (("reported", 0.35), ("estimated", 0.75)):
            now = {r["target"]: r[figure] for r in later["overflow"]["targets"]}
            before = {r["target"]: r[figure] for r in first["overflow"]["targets"]}
            assert now["runninghub"] == pytest.approx(before.get("runninghub", 0.0) + added)
        metrics.overflowed("proj", "comfyui", "coze")  # a target with no price set
        priced = await until(lambda: snapshot(base), lambda snap: spend(snap, "coze")[0] > 0)
        rows = {r["target"]: r["price"] for r in priced["overflow"]["targets"]}
        assert rows["runninghub"] == 0.25 and rows["coze"] is None  # "no price set", not 0.00
        assert priced["overflow"]["prices"] == {"runninghub": 0.25}


async def test_asynch_panel_when_configured(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    async with serve_app(fake_asynch(ADMIN)) as asynch_url:
        svc = service(tmp_path, redis, redis_url, asynch_url=asynch_url)
        async with serve_app(svc.app) as base:
            snap = await snapshot(base)
            assert snap["asynch"]["error"] is None and snap["asynch"]["url"] == asynch_url
            assert snap["asynch"]["models"] == OVERVIEW["models"]
            assert snap["asynch"]["recent"] == OVERVIEW["recent"]
    async with serve_app(fake_asynch("other")) as asynch_url:
        svc = service(tmp_path, redis, redis_url, asynch_url=asynch_url)
        async with serve_app(svc.app) as base:
            snap = await snapshot(base)
            assert snap["asynch"]["error"].startswith("HTTP 401")  # shown on the panel


async def test_the_dispatcher_serves_its_own_dashboard(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    md = DispatcherSettings(password="p" * 12, jwt_secret="j" * 40)
    base = Settings(
        redis_url=redis_url,
        token_secret="t" * 40,
        admin_token=ADMIN,
        data_dir=tmp_path,
        config_dir=tmp_path,
    )
    dispatcher = MessageDispatcher(md, core_settings(md, base), redis)
    async with serve_app(dispatcher.app) as url, httpx.AsyncClient(base_url=url) as http:
        page = await http.get("/dashboard")
        assert page.status_code == 200 and "aigcq" in page.text
        assert (await http.get("/api/admin/snapshot")).status_code == 401
        snap = await snapshot(url)
        assert [(q["AIGC"], q["platform"]) for q in snap["queues"]] == [("api", "comfyui")]
        assert snap["health"] is not None and snap["overflow"]["scope"] == "process"
