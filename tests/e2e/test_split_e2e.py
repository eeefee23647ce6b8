"""Issue 4 end to end, split topology: client → ``aigcq serve`` → ``aigcq dispatcher`` →
``aigcq bridge`` → emulated ComfyUI → TASK_END → client; RunningHub while the dispatcher
is down, internal again once it is back. Every piece is a real process."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.e2e.conftest import BRIDGE_TOKEN, SECRET, Client, Cluster, Proc, free_port, wait_http
from tests.e2e.test_bridge_e2e import AUTH, bridge_task, exactly_once

pytestmark = pytest.mark.e2e

MD_PASSWORD = "e2e-md-password"


def start_dispatcher(c: Cluster, port: int | None = None) -> tuple[Proc, int]:
    port = port or free_port()
    env = {
        "AIGCQ_REDIS_URL": c.redis_url,
        "AIGCQ_MD_PORT": str(port),
        "AIGCQ_DATA_DIR": str(c.tmp / f"md-{port}"),
        "AIGCQ_BRIDGE_TOKEN": BRIDGE_TOKEN,
        "AIGCQ_TOKEN_SECRET": SECRET,
        "AIGCQ_MD_JWT_SECRET": SECRET,
        "MD_PASSWORD": MD_PASSWORD,
        "AIGCQ_HEALTH_INTERVAL_S": "0.2",
        "AIGCQ_SWEEP_INTERVAL_S": "0.2",
    }
    proc = Proc(["dispatcher"], env, c.tmp / f"md-{port}.log").start()
    c.procs.append(proc)
    wait_http(f"http://127.0.0.1:{port}/api/health")
    return proc, port


def wait_free(md_port: int, free: int = 1, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = httpx.get(f"http://127.0.0.1:{md_port}/api/health").json()["data"]
        if data["healthy"] and data["freeSlots"] >= free:
            return
        time.sleep(0.05)
    raise TimeoutError(f"dispatcher never had {free} free slots: {data}")


async def task_target(port: int, task_id: str) -> str:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        target: str = (await http.get(f"/api/tasks/{task_id}", headers=AUTH)).json()["target"]
    return target


async def test_split_topology_overflow_and_recovery(
    cluster: Cluster,
) -> None:
    comfy = cluster.emulator("comfyui", "--step-time", "0.02", "--steps", "2")
    rh = cluster.emulator("runninghub", "--max-concurrent", "2", "--duration", "0.3")
    md, md_port = start_dispatcher(cluster)  # a restart reuses its port
    cluster.bridge(md_port, [comfy], "--heartbeat=0.5")
    wait_free(md_port)
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 2}}})
    _, port = cluster.server(
        AIGCQ_RUNNINGHUB_URL=rh,
        MESSAGE_DISPATCHER_URL=f"http://127.0.0.1:{md_port}",
        MD_PASSWORD=MD_PASSWORD,
        MESSAGE_DISPATCHER_HEALTH_CHECK_INTERVAL="200",
    )
    await asyncio.sleep(1.0)  # logged in, first health check passed
    client = await Client(port, "b1").connect()
    try:
        reply = await client.request(bridge_task("internal-1"))
        assert reply["type"] == "submitted", reply
        await client.collect(1, timeout=20)
        assert await task_target(port, "internal-1") == "message_dispatcher"

        md.kill()
        await asyncio.sleep(1.0)  # the next health check fails: degraded
        reply = await client.request(bridge_task("overflow-1"))
        assert reply["type"] == "submitted", reply
        await client.collect(2, timeout=20)
        assert await task_target(port, "overflow-1") == "runninghub"

        start_dispatcher(cluster, md_port)  # the bridge reconnects on its own
        wait_free(md_port, timeout=30)
        await asyncio.sleep(1.5)  # three passing checks 0.2 s apart: internal again
        reply = await client.request(bridge_task("internal-2"))
        assert reply["type"] == "submitted", reply
        await client.collect(3, timeout=20)
        assert await task_target(port, "internal-2") == "message_dispatcher"
        exactly_once(client, ["internal-1", "overflow-1", "internal-2"])
    finally:
        await client.close()
