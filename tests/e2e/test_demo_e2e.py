"""``aigcq up --demo`` as a newcomer runs it: tasks go to the GPUs first, then overflow."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest
import redis

from tests.fakes.client import Client, generate
from tests.fakes.processes import Proc, reserved_port, wait_http
from tests.fakes.waiting import wait_until_sync

pytestmark = pytest.mark.e2e


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


async def test_up_demo_runs_internal_first_then_overflows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = reserved_port()
    data = tmp_path / "data"
    env = {
        "AIGCQ_WS_PORT": str(port),
        "AIGCQ_CALLBACK_PORT": str(port),
        "AIGCQ_DATA_DIR": str(data),
        "AIGCQ_DEMO_STEP_TIME": "0.25",  # 3 nodes × 4 steps: 3 s a prompt
        "AIGCQ_DEMO_RUNNINGHUB_DURATION": "1",
    }
    for name in ("AIGCQ_REDIS_URL", "REDIS_URL", "AIGCQ_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    demo = Proc(["up", "--demo"], env, tmp_path / "demo.log").start()
    assert demo.p is not None
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        banner = (tmp_path / "demo.log").read_text()
        assert "aigcq submit comfyui" in banner and "--token" not in banner, banner
        mint = banner.split("export AIGCQ_CLIENT_TOKEN=$(", 1)[1].split(")\n", 1)[0]
        minted = subprocess.run(  # the banner's command, where the demo runs
            [sys.executable, "-m", "aigcq", *shlex.split(mint)[1:]],
            env={**os.environ, **env}, capture_output=True, check=True, text=True,
        )  # fmt: skip
        token = minted.stdout.strip()
        # the dashboard link works with the token kept where the secrets line says (a log
        # file is no terminal: the banner shows no secret there)
        assert f"127.0.0.1:{port}/dashboard (its admin token" in banner, banner
        assert f"secrets     {(data / 'secrets.json').resolve()}" in banner, banner
        admin = orjson.loads((data / "secrets.json").read_bytes())["admin_token"]
        assert admin not in banner, banner
        snapshot = httpx.get(
            f"http://127.0.0.1:{port}/api/admin/snapshot",
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert snapshot.status_code == 200, snapshot.text
        store = redis.Redis.from_url(f"unix://{data}/redis/redis.sock", decode_responses=True)

        def registered() -> bool:
            bridges = [store.hgetall(k) for k in store.keys("aigcq:bridge:*") if ":tasks" not in k]
            return any(b.get("availableInstanceCount") == "2" for b in bridges)

        wait_until_sync(registered, 30, 0.1, what=lambda: f"the demo bridge: {banner}")
        assert (data / "demo" / "config" / "model.json").exists()

        client = await Client(port, "demo", token=token).connect()
        ids = [f"demo-{i}" for i in range(6)]
        payload = {"workflowId": "demo", "nodeInfoList": []}
        for task_id in ids:
            await client.request(generate(task_id, aigc="aigcq", **payload))
        await client.collect(6, timeout=40)
        assert all(len(r) == 1 and r[0]["status"] == "success" for r in client.results.values())
        # the banner's JimuAI line: polled from the demo's emulated JimuAI
        assert "aigcq submit jimuai" in banner
        await client.request(generate("demo-jimu", "jimuai", "aigcq", prompt="a red fox"))
        await client.collect(7, timeout=30)
        [jimu] = client.results["demo-jimu"]
        assert jimu["status"] == "success" and jimu["data"]["data"][0]["fileType"] == "jpeg"
        await client.close()
        auth = {"Authorization": f"Bearer {token}"}
        targets = [
            httpx.get(f"http://127.0.0.1:{port}/api/tasks/{i}", headers=auth).json()["target"]
            for i in ids
        ]
        assert targets[:2] == ["bridge", "bridge"], targets
        assert "runninghub" in targets, targets
        children = children_of(demo.p.pid)
        assert len(children) >= 4, children  # 2 ComfyUI, RunningHub, JimuAI, bridge (and Redis)
    finally:
        demo.p.send_signal(signal.SIGINT)  # Ctrl-C
        demo.p.wait(20)
    wait_until_sync(lambda: not [pid for pid in children if alive(pid)], 5)  # all reaped
    assert not [pid for pid in children if alive(pid)], children
