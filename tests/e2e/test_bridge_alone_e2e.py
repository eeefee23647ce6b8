"""Issue 38: the bridge's distribution alone runs a task. ``aigcq-bridge`` runs in an
interpreter that sees only aigcq-bridge, aigcq-wire and their declared dependencies (no
redis, no psycopg, none of the server: :func:`tests.fakes.distributions.alone`), against a
real ``aigcq serve`` and a ComfyUI emulator."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import redis

from tests.fakes.client import Client, bridge_task, exactly_once
from tests.fakes.distributions import alone, isolated
from tests.fakes.processes import Cluster
from tests.fakes.waiting import wait_until_sync

pytestmark = pytest.mark.e2e

#: none of these may be importable where the bridge runs alone (its HTTP server is h11's)
ABSENT = (
    "redis", "psycopg", "psycopg_pool", "uvicorn", "fastapi", "starlette",
    "aigcq.queue", "aigcq.serve", "aigcq.asynch",
)  # fmt: skip

RUN_BRIDGE = f"""
import importlib.util, runpy
present = [m for m in {ABSENT!r} if importlib.util.find_spec(m) is not None]
assert not present, present
runpy.run_module("aigcq.agent", run_name="__main__", alter_sys=True)
"""


async def test_the_bridge_alone_connects_and_runs_a_task(cluster: Cluster, tmp_path: Path) -> None:
    comfy = cluster.emulator("comfyui", "--step-time", "0.02", "--steps", "2")
    # comfyui tasks of "proj" (the test client's project): our GPUs only, no paid overflow
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 0}}})
    _, port = cluster.server()
    command = isolated(alone("aigcq-bridge", tmp_path), RUN_BRIDGE)
    bridge, bridge_port = cluster.bridge(port, [comfy], "--heartbeat=0.5", command=command)
    bridge_id = httpx.get(f"http://127.0.0.1:{bridge_port}/api/status").json()["bridgeId"]
    key = f"aigcq:bridge:{bridge_id}"
    with redis.Redis.from_url(cluster.redis_url, decode_responses=True) as r:
        wait_until_sync(lambda: r.hget(key, "online") == "1", 20, what=f"{key} online")
    client = await Client(port, "biz-alone").connect()
    reply = await client.request(bridge_task("alone-1"))
    assert reply["type"] == "submitted", reply
    await client.collect(1, timeout=30)
    exactly_once(client, ["alone-1"])
    url = client.results["alone-1"][0]["data"]["data"][0]["fileUrl"]
    assert url.startswith(f"http://127.0.0.1:{bridge_port}/files/"), url
    assert httpx.get(url).content[:4] == b"\x89PNG"
    await client.close()
    assert bridge.p is not None and bridge.p.poll() is None  # still running, alone
