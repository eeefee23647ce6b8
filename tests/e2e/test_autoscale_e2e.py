"""Issue 40 end to end: the capacity planner rents real instances through its hook.

A serve (``AIGCQ_SCALE_COMMAND`` = tests/fakes/scale_hook.py), an owned pool of one
``aigcq bridge`` in front of one ComfyUI emulator, a rentable pool whose instances the hook
starts as real ``aigcq emulate comfyui`` + ``aigcq bridge`` processes, and RunningHub's
emulator with room. A flood that the owned GPU alone would finish past its start
deadlines: the planner rents, the new bridges register and take work, and from the moment
the first one registered nothing more is paid; once the flood ends the rented instances
are drained and named to the hook only when idle (it stops them). Nothing is lost, no task
is paid twice."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from aigcq.emulators._records import paid_runs
from tests.fakes import scale_hook
from tests.fakes.client import Client, bridge_task, exactly_once
from tests.fakes.processes import BRIDGE_TOKEN, Cluster
from tests.fakes.waiting import wait_until_sync

pytestmark = pytest.mark.e2e

TASKS = 24
#: our GPU alone would start the last ones past their safe start (a fifth of the wait:
#: AIGCQ_SHARE_MARGIN), with the two rented ones none: those are paid only until the
#: planner asked for the instances (then they count as slots that free when they boot)
MAX_WAIT_MS = 120_000
STEP_TIME = "0.25"  # a prompt of E2E_GRAPH: 3 nodes x 2 steps, 1.5 s
POOLS = {
    "own": {"price_per_hour": 0, "min": 1, "max": 1},
    "rent": {"price_per_hour": 1.0, "billing_step": "second", "boot_s": 4, "max": 2},
}


def hook_calls(home: Path) -> list[dict[str, Any]]:
    log = home / "hook.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_flood_rents_instances_that_take_work_and_stop_only_when_idle(
    cluster: Cluster,
) -> None:
    c = cluster
    rh = c.emulator("runninghub", "--max-concurrent", "2", "--duration", "0.5")
    own_comfy = c.emulator("comfyui", "--step-time", STEP_TIME, "--steps", "2")
    c.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 2}}})
    (c.config_dir / "pools.json").write_text(json.dumps(POOLS))
    home = c.tmp / "rented"
    home.mkdir()
    server_port = c.ports.take()
    (home / "hook.json").write_text(
        json.dumps(
            {
                "server": f"ws://127.0.0.1:{server_port}/ws",
                "token": BRIDGE_TOKEN,
                "comfyui_args": ["--step-time", STEP_TIME, "--steps", "2"],
                "ports": [c.ports.take() for _ in range(8)],  # 2 per instance, 4 instances
            }
        )
    )
    _, port = c.server(
        server_port,
        AIGCQ_RUNNINGHUB_URL=rh,
        AIGCQ_OVERFLOW_PRICE=json.dumps({"runninghub": 0.05}),
        AIGCQ_SCALE_COMMAND=f"{sys.executable} {scale_hook.__file__} {home}",
        AIGCQ_CAPACITY_INTERVAL_S="0.5",
        AIGCQ_CAPACITY_HORIZON_S="30",  # beyond the flood's safe start (24 s)
        AIGCQ_SHARE_DEFAULT_RUN_S="1.5",  # the operator knows the workflow's run time
    )
    own_dir = c.tmp / "own-bridge"
    own_dir.mkdir()
    (own_dir / "bridge_id").write_text("own-1\n")
    c.bridge(port, [own_comfy], "--heartbeat=0.5", f"--data-dir={own_dir}")
    r = redis.Redis.from_url(c.redis_url, decode_responses=True)
    wait_until_sync(lambda: r.hget("aigcq:bridge:own-1", "online") == "1", 20, what="own-1")

    client = await Client(port, "biz-flood").connect()
    ids = [f"flood-{i}" for i in range(TASKS)]
    for task_id in ids:
        reply = await client.request({**bridge_task(task_id), "maxWaitMs": MAX_WAIT_MS})
        assert reply["type"] == "submitted", reply

    def registered() -> list[str]:
        return [b for b in ("rent-0", "rent-1") if r.hget(f"aigcq:bridge:{b}", "online") == "1"]

    wait_until_sync(lambda: registered(), 30, what="a rented bridge registered")

    await client.collect(TASKS, timeout=90)
    exactly_once(client, ids)

    calls = hook_calls(home)
    assert calls[0]["pool"] == "rent" and calls[0]["desired"] >= 1, calls
    state = json.loads((home / "instances.json").read_text())
    rented = sorted(state["up"])
    assert rented and set(rented) <= {"rent-0", "rent-1"}, state
    ran_rented = [b for b in rented if _prompts(home, b) > 0]
    assert ran_rented, "no rented instance took work"
    records = httpx.get(f"{rh}/_emulator/records").json()
    creates = [x for rec in records.values() for x in rec["creates"]]
    assert max(paid_runs(records).values(), default=0) <= 1  # never paid twice
    asked = calls[0]["at"] + 0.5  # the round that asked counts them from then on
    late = [(x["task"], round(x["at"] - asked, 2)) for x in creates if x["at"] > asked]
    assert not late, f"paid while rented GPUs booted or were up: {late}; hook: {calls}"

    # the flood is over: the rented ones are drained, then named to the hook once idle
    pids = [pid for b in rented for pid in state["up"][b]["pids"]]
    wait_until_sync(
        lambda: all(b in {s for call in hook_calls(home) for s in call["stop"]} for b in rented),
        90,
        what=lambda: f"the hook told to stop {rented}: {hook_calls(home)}",
    )
    wait_until_sync(lambda: not any(alive(p) for p in pids), 20, what="rented processes ended")
    await client.linger(0.5)
    exactly_once(client, ids)  # nothing lost, nothing delivered twice across the scale-in
    await client.close()


def _prompts(home: Path, bridge_id: str) -> int:
    """How many prompts the rented instance's ComfyUI emulator saved outputs for."""
    out = home / bridge_id / "out"
    return len(list(out.rglob("*.png"))) if out.exists() else 0
