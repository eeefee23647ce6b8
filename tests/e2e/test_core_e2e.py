"""Issue 2's end-to-end checks: real processes, real Redis, RunningHub/Coze emulators."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from aigcq.embedded.redis import EmbeddedRedis
from aigcq.plumbing.signing import signature
from tests.fakes.client import CLIENT_TOKEN, Client, generate
from tests.fakes.processes import ADMIN_TOKEN, SECRET, Cluster
from tests.fakes.waiting import until, wait_until

pytestmark = pytest.mark.e2e


def cli(*args: str) -> str:
    """Run ``aigcq ARGS`` as a user would and return what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "aigcq", *args],
        capture_output=True, text=True, timeout=30, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def setup_rh(cluster: Cluster, *, cap: int = 3, duration: str = "0.3", **env: str) -> int:
    rh = cluster.emulator("runninghub", "--max-concurrent", str(cap), "--duration", duration)
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": cap}}})
    _, port = cluster.server(AIGCQ_RUNNINGHUB_URL=rh, **env)
    cluster.rh_url = rh  # type: ignore[attr-defined]
    return port


async def test_runninghub_cap_is_never_exceeded_and_all_results_arrive(cluster: Cluster) -> None:
    port = setup_rh(cluster, cap=3)
    client = await Client(port, "biz-1").connect()
    for i in range(10):
        reply = await client.request(generate(f"rh-{i}"))
        assert reply["type"] == "submitted" and reply["code"] == "AssessmentSuccess"
    await client.collect(10, timeout=30)
    await client.linger(0.5)
    assert all(len(r) == 1 for r in client.results.values())
    assert all(r[0]["status"] == "success" for r in client.results.values())
    first = client.results["rh-0"][0]
    assert first["result"]["code"] == 0 and first["result"]["data"][0]["fileUrl"]
    assert first["data"] == first["result"]  # the documented alias
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{cluster.rh_url}/_emulator/stats")).json()  # type: ignore[attr-defined]
    assert max(stats["peak_concurrent"].values()) <= 3
    await client.close()


async def test_http_api_submit_get_and_queues(cluster: Cluster) -> None:
    port = setup_rh(cluster)
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
    async with httpx.AsyncClient(base_url=base, headers=auth) as http:
        body = {
            "taskId": "http-1",
            "platform": "comfyui",
            "AIGC": "proj",
            "payload": {"workflowId": "1", "nodeInfoList": []},
        }
        resp = await http.post("/api/tasks", json=body)
        assert resp.status_code == 202, resp.text

        async def get() -> dict[str, Any]:
            task: dict[str, Any] = (await http.get("/api/tasks/http-1")).json()
            return task

        task = await until(get, lambda t: t["state"] in ("success", "failed"), 15, 0.1)
        assert task["state"] == "success"
        assert [e["state"] for e in task["timeline"]] == [
            "pending",
            "dispatching",
            "running",
            "success",
        ]
        recent = (await http.get("/api/tasks")).json()
        assert recent[0]["taskId"] == "http-1" and recent[0]["target"] == "runninghub"
        queues = (await http.get("/api/queues")).json()
        assert queues[0]["AIGC"] == "proj" and queues[0]["capacity"] == {
            "bridge": 0,
            "runninghub": 3,
        }
        assert (await http.get("/api/tasks/nope")).status_code == 404
        assert (
            await http.get("/api/queues", headers={"Authorization": "Bearer x"})
        ).status_code == 401
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        status = cli("status", "--server", base, "--token", ADMIN_TOKEN)
        assert "queues" in status and "bridges" in status and "http-1" in status
        shown = cli("tasks", "show", "http-1", "--server", base, "--token", CLIENT_TOKEN)
        assert "dispatching" in shown and "runninghub" in shown
        assert (
            await http.put("/api/workflows/w1", json={"1": {}}, headers=admin)
        ).status_code == 200


async def test_coze_runs_by_polling(cluster: Cluster) -> None:
    coze = cluster.emulator("coze", "--duration", "0.3")
    cluster.write_models({"proj": {"coze": {"apikey": "pat_test", "concurrency": 5}}})
    _, port = cluster.server(AIGCQ_COZE_URL=coze, AIGCQ_POLL_INTERVAL_S="0.2")
    client = await Client(port, "biz-coze").connect()
    for i in range(3):
        await client.request(
            generate(f"coze-{i}", platform="coze", workflow_id="7", parameters={"q": i})
        )
    await client.collect(3, timeout=30)
    assert {r[0]["status"] for r in client.results.values()} == {"success"}
    await client.close()


async def test_results_wait_for_an_offline_client(cluster: Cluster) -> None:
    port = setup_rh(cluster, duration="0.1")
    client = await Client(port, "biz-off").connect()
    for i in range(5):
        await client.request(generate(f"off-{i}"))
    await client.close()
    await until(
        lambda: task_states(port, [f"off-{i}" for i in range(5)]),
        lambda states: set(states) == {"success"},  # done while the client was away
        within=20,
    )
    again = await Client(port, "biz-off").connect()
    await again.collect(5, timeout=20)
    await again.linger(0.3)
    assert sorted(again.results) == [f"off-{i}" for i in range(5)]
    assert all(len(r) == 1 for r in again.results.values())
    await again.close()


async def test_two_servers_deliver_across_processes(cluster: Cluster) -> None:
    port_a = setup_rh(cluster, duration="0.1")
    _, port_b = cluster.server(AIGCQ_RUNNINGHUB_URL=cluster.rh_url)  # type: ignore[attr-defined]
    submitter = await Client(port_a, "biz-x").connect()
    await submitter.request(generate("cross-0"))
    await submitter.close()
    receiver = await Client(port_b, "biz-x").connect()
    await receiver.collect(1, timeout=20)
    assert receiver.results["cross-0"][0]["status"] == "success"
    await receiver.close()


async def test_sigkill_server_with_50_in_flight_loses_nothing(cluster: Cluster) -> None:
    rh = cluster.emulator("runninghub", "--max-concurrent", "100", "--duration", "1.5")
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 100}}})
    server, port = cluster.server(AIGCQ_RUNNINGHUB_URL=rh, AIGCQ_TASK_DEADLINE_S="6")
    client = await Client(port, "biz-kill").connect()
    for i in range(50):
        await client.request(generate(f"k-{i}"))

    def all_created() -> bool:  # on RunningHub, 1.5 s each: all 50 in flight
        return bool(httpx.get(f"{rh}/_emulator/stats").json()["created"] == 50)

    await wait_until(all_created, 10, 0.05)
    server.kill()
    restart = functools.partial(
        cluster.server, port, AIGCQ_RUNNINGHUB_URL=rh, AIGCQ_TASK_DEADLINE_S="6"
    )
    again = await client.resumed(restart, 50, linger=1.0)
    assert sorted(again.results) == sorted(f"k-{i}" for i in range(50))
    assert all(len(r) == 1 for r in again.results.values()), {
        k: len(v) for k, v in again.results.items() if len(v) != 1
    }
    await again.close()


async def test_421_from_runninghub_never_fails_a_task(cluster: Cluster) -> None:
    rh = cluster.emulator("runninghub", "--max-concurrent", "3", "--duration", "0.3")
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 10}}})
    _, port = cluster.server(AIGCQ_RUNNINGHUB_URL=rh, AIGCQ_FULL_BACKOFF_S="0.2")
    client = await Client(port, "biz-421").connect()
    for i in range(10):
        await client.request(generate(f"full-{i}"))
    await client.collect(10, timeout=40)
    assert {r[0]["status"] for r in client.results.values()} == {"success"}
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{rh}/_emulator/stats")).json()
    assert stats["rejected_full"] > 0  # RunningHub did say 421 ...
    assert max(stats["peak_concurrent"].values()) <= 3  # ... and never ran more than 3
    await client.close()


async def test_redis_killed_and_restarted_under_a_running_server_loses_nothing(
    tmp_path: Path,
) -> None:
    """SIGKILL Redis (AOF, fsync every second) with tasks queued and running; start it
    again: the server reconnects by itself, and every result arrives exactly once."""
    redis = EmbeddedRedis(tmp_path / "redis", persist=True)
    cluster = Cluster(tmp_path, redis.start())
    try:
        port = setup_rh(cluster, cap=5, duration="1.0", AIGCQ_TASK_DEADLINE_S="6")
        client = await Client(port, "biz-redis").connect()
        for i in range(15):  # 5 run at once, 10 wait
            await client.request(generate(f"rk-{i}"))
        await asyncio.sleep(1.5)  # time: past the AOF's one-second fsync
        redis.kill()
        # A TASK_END that arrives now is refused with 503, so that its sender retries.
        query = {"t": "rk-0", "a": 1, "s": signature(SECRET.encode(), "rk-0", 1)}
        body = {"event": "TASK_END", "taskId": "r", "eventData": '{"code":0,"data":[]}'}
        async with httpx.AsyncClient() as http:
            url = f"http://127.0.0.1:{port}/callback/all"
            refused = await http.post(url, params=query, json=body)
        assert refused.status_code == 503, refused.text
        assert refused.json()["code"] == "AssessmentError"
        await asyncio.sleep(1.0)  # time: Redis stays down a while, tasks still running
        redis.start()
        for i in range(15, 20):  # new work is taken as soon as Redis is back
            reply = await until_submitted(client, f"rk-{i}")
            assert reply["type"] == "submitted", reply
        await client.collect(20, timeout=60)
        await client.linger(1.0)
        assert sorted(client.results) == sorted(f"rk-{i}" for i in range(20))
        assert all(len(r) == 1 for r in client.results.values()), client.results
        assert {r[0]["status"] for r in client.results.values()} == {"success"}
        await client.close()
    finally:
        cluster.close()
        redis.stop()


async def until_submitted(client: Client, task_id: str, within: float = 10.0) -> dict[str, Any]:
    """Submit until accepted: the first tries may meet Redis still loading its AOF."""
    return await until(
        lambda: client.request(generate(task_id)), lambda r: r["type"] == "submitted", within, 0.2
    )


async def task_states(port: int, ids: list[str]) -> list[str]:
    """The state of each of ``ids``, from the server's HTTP API."""
    auth = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=auth) as http:
        return [(await http.get(f"/api/tasks/{i}")).json().get("state", "") for i in ids]
