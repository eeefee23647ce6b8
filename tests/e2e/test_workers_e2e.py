"""``AIGCQ_WORKERS=2``: two server processes share the ports; one dying loses nothing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.fakes.client import Client, generate
from tests.fakes.processes import Cluster
from tests.fakes.waiting import wait_until

pytestmark = pytest.mark.e2e


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"


async def test_two_workers_share_the_port_and_survive_one_killed(cluster: Cluster) -> None:
    rh = cluster.emulator("runninghub", "--max-concurrent", "10", "--duration", "0.3")
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 10}}})
    supervisor, port = cluster.server(AIGCQ_RUNNINGHUB_URL=rh, AIGCQ_WORKERS="2")
    assert supervisor.p is not None
    pid = supervisor.p.pid
    await wait_until(lambda: len(children(pid)) == 2, 10, 0.05)
    workers = children(pid)

    # Connections land on both workers; each client gets exactly its own results.
    clients = [await Client(port, f"biz-{i}").connect() for i in range(6)]
    for i in range(30):
        await clients[i % 6].send(generate(f"w-{i}"))

    def created() -> int:
        return int(httpx.get(f"{rh}/_emulator/stats").json()["created"])

    await wait_until(lambda: created() >= 10, 10, 0.05)  # RunningHub's 10 slots are busy
    os.kill(workers[0], signal.SIGKILL)  # mid-run: its sockets drop, its tasks are swept
    await wait_until(lambda: workers[0] not in children(pid) and len(children(pid)) == 2, 10)

    survivors: list[Client] = []
    for i, client in enumerate(clients):
        try:
            await client.linger(0.05)  # raises on a socket the killed worker held
            survivors.append(client)
        except Exception:
            fresh = await Client(port, f"biz-{i}").connect()  # resumes from its outbox
            fresh.results = client.results
            survivors.append(fresh)
    for i, client in enumerate(survivors):
        await client.collect(5, timeout=40)
        await client.linger(0.5)
        assert sorted(client.results) == sorted(f"w-{j}" for j in range(i, 30, 6))
        assert all(len(r) == 1 for r in client.results.values()), client.results
        await client.close()

    running = children(pid)
    supervisor.p.send_signal(signal.SIGTERM)
    assert supervisor.p.wait(30) == 0
    assert not any(alive(pid) for pid in running)


def test_a_port_in_use_stops_serve_before_any_worker(cluster: Cluster) -> None:
    """A port held by another program: one line naming it and its setting, no worker
    started (so no restart loop)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, **cluster.server_env(port, AIGCQ_WORKERS="2")}
        done = subprocess.run(
            [sys.executable, "-m", "aigcq", "serve"], env=env, capture_output=True, timeout=60
        )
    assert done.returncode == 1
    assert done.stderr.decode().strip() == (
        f"error: cannot listen on 127.0.0.1:{port}: already in use "
        "(set AIGCQ_WS_PORT to use another port)"
    )
