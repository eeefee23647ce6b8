"""Issue 29 item 5 with real ``aigcq serve`` processes: a pause written through one server
holds on another at once, and on a server started after both stopped; resumed there, the
held task runs, once."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fakes.client import Client, generate
from tests.fakes.processes import ADMIN_TOKEN, Cluster
from tests.fakes.waiting import wait_until

pytestmark = pytest.mark.e2e

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
KEY, OTHER_KEY = "k" * 32, "o" * 32


def admin(port: int, method: str, path: str, **body: Any) -> Any:
    r = httpx.request(method, f"http://127.0.0.1:{port}{path}", json=body or None, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


def creates(rh: str) -> dict[str, list[str]]:
    records = httpx.get(f"{rh}/_emulator/records").json()
    return {key: [c["task"] for c in rec["creates"]] for key, rec in records.items()}


async def test_a_pause_holds_on_every_server_and_across_a_restart(cluster: Cluster) -> None:
    rh = cluster.emulator("runninghub", "--max-concurrent", "10", "--duration", "0.2")
    cluster.write_models(
        {
            "proj": {"comfyui": {"apikey": KEY, "concurrency": 5}},
            "other": {"comfyui": {"apikey": OTHER_KEY, "concurrency": 5}},
        }
    )
    first, port1 = cluster.server(AIGCQ_RUNNINGHUB_URL=rh)
    second, port2 = cluster.server(AIGCQ_RUNNINGHUB_URL=rh)
    paused = admin(port1, "POST", "/api/admin/pause", kind="project", name="proj", note="e2e")
    assert paused["changed"] is True

    client = await Client(port2, "biz").connect()
    await client.send(generate("held", aigc="proj"))
    await client.send(generate("o-1", aigc="other"))  # after it: its result shows a round ran
    await client.collect(1, timeout=30)
    assert list(client.results) == ["o-1"]
    assert admin(port2, "GET", "/api/tasks/held")["state"] == "pending"
    await client.close()

    first.stop()
    second.stop()
    _, port3 = cluster.server(AIGCQ_RUNNINGHUB_URL=rh)
    [kept] = admin(port3, "GET", "/api/admin/pauses")["pauses"]
    assert (kept["kind"], kept["name"], kept["note"]) == ("project", "proj", "e2e")
    client = await Client(port3, "biz").connect()
    await client.request(generate("o-2", aigc="other"))
    await wait_until(lambda: _finished(port3, "o-2"), 30)  # a round of the new server ran
    assert admin(port3, "GET", "/api/tasks/held")["state"] == "pending"
    assert KEY not in creates(rh)

    admin(port3, "POST", "/api/admin/resume", kind="project", name="proj")
    await wait_until(lambda: _finished(port3, "held"), 30)
    assert creates(rh)[KEY] == ["held"]
    await client.close()


def _finished(port: int, task_id: str) -> bool:
    return bool(admin(port, "GET", f"/api/tasks/{task_id}")["state"] == "success")
