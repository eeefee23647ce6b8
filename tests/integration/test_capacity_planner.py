"""The capacity planner in serve (issue 40), on a real Redis: a flood with start deadlines
asks a rentable pool for instances (the hook, ``/api/capacity``, the KEDA endpoint, the
gauge); an idle rented bridge is drained first and named to the hook only once idle."""

from __future__ import annotations

import json
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from rich.console import Console

from aigcq.cli.status import render
from aigcq.config import PlatformConfig, Settings
from aigcq.serve.server import ServeProcess
from tests.fakes.bridge import BRIDGE_TOKEN
from tests.fakes.client import bridge_task, generate
from tests.fakes.servers import serve_app
from tests.fakes.service import SECRET, Env
from tests.fakes.waiting import until

ADMIN = "capacity-admin"
HEADERS = {"Authorization": f"Bearer {ADMIN}"}
MODELS = '{"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}'
POOLS = {
    "own": {"price_per_hour": 0, "min": 1, "max": 1},
    "rent": {"price_per_hour": 1.0, "billing_step": "second", "boot_s": 5, "max": 3},
}


@pytest.fixture
async def env(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, request: pytest.FixtureRequest
) -> AsyncIterator[Env]:
    """A serve with ``POOLS`` (or the pools a test gives as its parameter)."""
    (tmp_path / "model.json").write_text(MODELS)
    (tmp_path / "pools.json").write_text(json.dumps(getattr(request, "param", POOLS)))
    hook = tmp_path / "hook.sh"
    hook.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "hook.log"}\n')
    hook.chmod(hook.stat().st_mode | stat.S_IEXEC)
    settings = Settings(
        redis_url=redis_url,
        token_secret=SECRET,
        config_dir=tmp_path,
        bridge_token=BRIDGE_TOKEN,
        admin_token=ADMIN,
        capacity_interval_s=3600,  # the test runs the rounds
        capacity_patience_s=30,
        scale_command=str(hook),
        metrics_token="scrape",
    )
    service = ServeProcess(settings, PlatformConfig.load(tmp_path), redis)
    async with serve_app(service.app) as base:
        env = Env(int(base.rsplit(":", 1)[1]), redis, service)
        yield env
        for ws in env.sockets:
            await ws.close()


def hook_lines(tmp_path: Path) -> list[str]:
    log = tmp_path / "hook.log"
    return log.read_text().splitlines() if log.exists() else []


async def test_a_flood_rents_and_idle_rented_bridges_drain_before_stop(
    env: Env, tmp_path: Path
) -> None:
    own = await env.bridge()
    await own.register("own-1", count=1)
    client = await env.client()
    for i in range(12):
        await client.request(generate(f"cap-{i}"))
    await own.next()  # the owned instance took the first; the rest wait

    plan = await env.service.capacity.round()
    # the forecast's arrivals: the waiting ones and the one already running on our GPU
    assert {f"cap-{i}" for i in range(12)} <= set(env.service.capacity.arrivals)
    rent = plan.pools["rent"]
    assert rent.desired > 0 and rent.reason.startswith("rent"), rent
    assert plan.pools["own"].desired == 1
    assert hook_lines(tmp_path) == [f"rent {rent.desired}"]
    async with httpx.AsyncClient(base_url=env.base) as http:
        assert (await http.get("/api/capacity")).status_code == 401
        view = (await http.get("/api/capacity", headers=HEADERS)).json()
        rows = {row["pool"]: row for row in view["pools"]}
        assert rows["rent"]["desired"] == rent.desired
        assert set(rows["rent"]["projectedCost"]) == {"queue", "rent", "overflow", "plan"}
        keda = await http.get(
            "/api/capacity/keda",
            params={"pool": "rent"},
            headers={"Authorization": "Bearer scrape"},
        )
        assert keda.json()["desired"] == rent.desired
        metrics = (await http.get("/metrics", headers={"Authorization": "Bearer scrape"})).text
        assert f'aigcq_desired_instances{{pool="rent"}} {float(rent.desired)}' in metrics
        snap = (await http.get("/api/admin/snapshot", headers=HEADERS)).json()
    # where operators look: the admin snapshot (the dashboard's) and ``aigcq status``
    assert {row["pool"]: row["desired"] for row in snap["capacity"]["pools"]}[
        "rent"
    ] == rent.desired
    snap["recent"] = []
    console = Console(width=200, record=True)
    console.print(render(snap))
    shown = console.export_text()
    assert "capacity (pools.json)" in shown and rent.reason[:40] in shown, shown

    # the asked-for instances count as booting, so a second round asks nothing more
    again = await env.service.capacity.round()
    assert again.pools["rent"].booting == rent.desired
    assert again.pools["rent"].desired == rent.desired
    assert hook_lines(tmp_path) == [f"rent {rent.desired}"]


async def test_an_idle_rented_bridge_is_drained_then_named_once_idle(
    env: Env, tmp_path: Path
) -> None:
    rented = await env.bridge()
    await rented.register("rent-1", count=1)
    await until(lambda: env.redis.exists(env.service.rt.store.keys.bridge("rent-1")), bool)

    first = await env.service.capacity.round()
    assert first.pools["rent"].stop == ("rent-1",)
    pauses = await env.redis.hgetall(env.service.rt.store.keys.pauses)
    assert "bridge:rent-1" in pauses  # drained: it takes no new task
    assert all("rent-1" not in line for line in hook_lines(tmp_path))

    second = await env.service.capacity.round()  # idle, drained: named to the hook
    assert "rent 0 rent-1" in hook_lines(tmp_path), (second, hook_lines(tmp_path))
    assert "bridge:rent-1" not in await env.redis.hgetall(env.service.rt.store.keys.pauses)


async def test_a_drained_bridge_is_undrained_when_the_work_comes_back_first(
    env: Env, tmp_path: Path
) -> None:
    rented = await env.bridge()
    await rented.register("rent-1", count=1)
    await until(lambda: env.redis.exists(env.service.rt.store.keys.bridge("rent-1")), bool)
    await env.service.capacity.round()
    keys = env.service.rt.store.keys
    assert "bridge:rent-1" in await env.redis.hgetall(keys.pauses)

    client = await env.client()
    await client.request(generate("cap-back"))  # the owned pool is down: only rent-1 can run it
    got = await env.service.capacity.round()
    assert got.pools["rent"].desired >= 1, env.service.capacity.view()
    assert "bridge:rent-1" not in await env.redis.hgetall(keys.pauses)
    assert all("rent-1" not in line for line in hook_lines(tmp_path))
    assigned = await rented.next()
    assert assigned["type"] == "TASK_ASSIGN"


#: two rentable pools: only ``invert`` has the node class the flood's workflow needs
BY_NODES = {
    "own": {"price_per_hour": 0, "min": 1, "max": 1},
    "plain": {"price_per_hour": 0.5, "boot_s": 5, "max": 3, "node_classes": ["EmptyImage"]},
    "invert": {
        "price_per_hour": 1.0,
        "boot_s": 5,
        "max": 3,
        "node_classes": ["EmptyImage", "ImageInvert", "SaveImage"],
    },
}


@pytest.mark.parametrize("env", [BY_NODES], indirect=True)
async def test_a_flood_rents_the_pool_whose_instances_have_its_node_classes(env: Env) -> None:
    """Issue 40: what a task's workflow needs (its node classes, as the hub reads them to
    place it) decides which pool rents: the cheaper pool lacks ``ImageInvert``."""
    own = await env.bridge()
    await own.register("own-1", count=1)
    client = await env.client()
    for i in range(12):
        await client.request(bridge_task(f"inv-{i}"))
    await own.next()
    plan = await env.service.capacity.round()
    assert plan.pools["invert"].desired > 0, plan.pools
    assert plan.pools["plain"].desired == 0, plan.pools
