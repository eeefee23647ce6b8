"""The reference bridge (``aigcq bridge``) recovering, on a fleet of real processes: Redis,
``aigcq serve``, two ``aigcq bridge`` each in front of one ComfyUI emulator
(``aigcq emulate comfyui``), every setting at its default. Prints JSON.

Measures (issue 24's targets in brackets):

* ``instance_death``  a ComfyUI SIGKILLed mid-prompt → a later attempt of the task queued on
  the other bridge's ComfyUI (< 1 s); its bridge sees the instance down and ends the prompt
  as ``InstanceLost`` at once, the hub retries it there;
* ``cancel_next``     both instances busy and a task waiting; one running task cancelled by
  its client → the waiting task running on the freed instance (< 1.5 s, with 0 refusals:
  its prompt is its first attempt's). ComfyUI goes on for ``INTERRUPT_S`` (0.95 s, as real
  ComfyUI's sampler does) after ``/interrupt``, so the slot is free only then;
* ``server_back``     ``aigcq serve`` SIGKILLed for ``--outage-s`` (40 s, as in the issue)
  while a prompt runs, then started again on its port: the port accepting connections →
  each bridge connected again (< 2 s), and → the TASK_END of the prompt that finished during
  the outage taken by the server (its bridge's spool empty).

Times are wall-clock: the emulators' ``/queue`` and the bridges' ``/api/status`` are polled
every 5 ms, so each figure is late by up to about that much.

    python bench/agent_bench.py [--death-trials 3] [--cancel-trials 3] [--outage-trials 2]
                                [--outage-s 40]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from bench.host import python_speed_ms
from tests.fakes.client import Client, bridge_task
from tests.fakes.processes import Cluster, Proc, wait_http

from aigcq.embedded.redis import EmbeddedRedis

POLL_S = 0.005
#: what real ComfyUI takes to stop a prompt after ``/interrupt``
INTERRUPT_S = 0.95
#: 3 nodes × 10 steps × 0.1 s: a prompt runs about 3 s
COMFY_ARGS = (
    *("--step-time", "0.1", "--steps", "10", "--log-level", "WARNING"),
    *("--interrupt-latency", str(INTERRUPT_S)),
)


class Fleet:
    """The processes, and what the bench polls."""

    def __init__(self, cluster: Cluster, http: httpx.AsyncClient) -> None:
        self.cluster, self.http = cluster, http
        cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 0}}})
        self.server, self.port = cluster.server()
        self.comfy = [cluster.emulator("comfyui", *COMFY_ARGS) for _ in range(2)]
        self.comfy_procs = cluster.procs[-2:]
        self.bridge_ports = [cluster.bridge(self.port, [url])[1] for url in self.comfy]

    async def status(self, bridge: int) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.bridge_ports[bridge]}/api/status"
        status: dict[str, Any] = (await self.http.get(url)).json()
        return status

    async def queued(self, comfy: int) -> list[str]:
        """Prompt ids running or waiting on that ComfyUI ([] when it does not answer)."""
        try:
            q = (await self.http.get(f"{self.comfy[comfy]}/queue", timeout=1.0)).json()
        except httpx.HTTPError:
            return []
        return [item[1] for item in (*q["queue_running"], *q["queue_pending"])]

    async def all_free(self) -> None:
        """Until both bridges report their instance connected and free."""
        while True:
            counts = [(await self.status(b))["availableInstanceCount"] for b in range(2)]
            connected = [(await self.status(b))["connection"]["state"] for b in range(2)]
            if counts == [1, 1] and connected == ["connected"] * 2:
                await asyncio.sleep(0.5)  # the hub has applied their reports
                return
            await asyncio.sleep(0.05)

    def restart_comfy(self, index: int) -> None:
        old = self.comfy_procs[index]
        self.comfy_procs[index] = again = Proc(old.args, old.env, old.log).start()
        self.cluster.procs.append(again)
        wait_http(f"{self.comfy[index]}/system_stats")

    async def client(self, name: str) -> Client:
        return await Client(self.port, name).connect()


async def until_true(probe: Any, within: float = 30.0) -> float:
    """Poll ``probe`` (async) until truthy; the wall time it first held."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await probe():
            return time.time()
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"{probe} did not hold within {within}s")


async def running_on(fleet: Fleet, prompt_id: str) -> int:
    """The ComfyUI (0 or 1) on which ``prompt_id`` runs or waits."""
    while True:
        for i in range(2):
            if prompt_id in await fleet.queued(i):
                return i
        await asyncio.sleep(POLL_S)


async def instance_death(fleet: Fleet, trials: int) -> dict[str, Any]:
    figures: list[float] = []
    client = await fleet.client("death")
    try:
        for trial in range(trials):
            await fleet.all_free()
            task_id = f"death-{trial}"
            assert (await client.request(bridge_task(task_id)))["type"] == "submitted"
            victim = await running_on(fleet, task_id)
            killed = time.time()
            fleet.comfy_procs[victim].kill()
            other = 1 - victim

            async def moved(other: int = other, task_id: str = task_id) -> bool:
                # a later attempt's prompt (``<taskId>-<attempt>``)
                return any(p.startswith(f"{task_id}-") for p in await fleet.queued(other))

            figures.append((await until_true(moved) - killed) * 1000)
            result = await client.next(timeout=30)
            print(f"death trial {trial}: {figures[-1]:.0f} ms, {result['status']}", file=sys.stderr)
            fleet.restart_comfy(victim)
    finally:
        await client.close()
    return {
        "trials": trials,
        "kill_to_running_elsewhere_ms": [round(f) for f in figures],
        "median_ms": round(statistics.median(figures)),
        "max_ms": round(max(figures)),
        "target_ms": 1000,
    }


async def cancel_next(fleet: Fleet, trials: int) -> dict[str, Any]:
    figures: list[float] = []
    refused = 0
    client = await fleet.client("cancel")
    try:
        for trial in range(trials):
            await fleet.all_free()
            busy = [f"busy-{trial}-{i}" for i in range(2)]
            for task_id in busy:
                assert (await client.request(bridge_task(task_id)))["type"] == "submitted"
            await running_on(fleet, busy[0])
            await running_on(fleet, busy[1])
            waiting = f"next-{trial}"
            assert (await client.request(bridge_task(waiting)))["type"] == "submitted"
            cancelled = time.time()
            reply = await client.request({"type": "cancel", "taskId": busy[0]})
            assert reply["type"] == "cancelled", reply

            async def started(task_id: str = waiting) -> bool:
                queued = [p for i in range(2) for p in await fleet.queued(i)]
                return any(p.startswith(task_id) for p in queued)

            figures.append((await until_true(started) - cancelled) * 1000)
            queued = [p for i in range(2) for p in await fleet.queued(i)]
            refused += waiting not in queued  # a later attempt's prompt: it was refused
            ended: set[str] = set()
            while not {busy[1], waiting} <= ended:
                ended.add((await client.next(timeout=30))["taskId"])
            print(f"cancel trial {trial}: {figures[-1]:.0f} ms", file=sys.stderr)
    finally:
        await client.close()
    return {
        "trials": trials,
        "interrupt_latency_ms": round(INTERRUPT_S * 1000),
        "cancel_to_next_running_ms": [round(f) for f in figures],
        "max_ms": round(max(figures)),
        "target_ms": 1500,
        "refused": refused,
    }


async def listening(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True


async def server_back(fleet: Fleet, trials: int, outage_s: float) -> dict[str, Any]:
    reconnected: list[float] = []
    delivered: list[float] = []
    for trial in range(trials):
        await fleet.all_free()
        client = await fleet.client(f"outage-{trial}")
        task_id = f"outage-{trial}"
        assert (await client.request(bridge_task(task_id)))["type"] == "submitted"
        ran_on = await running_on(fleet, task_id)
        await client.close()
        fleet.server.kill()
        await asyncio.sleep(outage_s)  # time: the outage is the subject
        assert task_id in (await fleet.status(ran_on))["spooled"], "finished during the outage"
        old = fleet.server
        fleet.server = Proc(old.args, old.env, old.log).start()
        fleet.cluster.procs.append(fleet.server)
        back = await until_true(lambda: listening(fleet.port))

        async def connected(b: int) -> bool:
            return bool((await fleet.status(b))["connection"]["state"] == "connected")

        for b in range(2):
            await until_true(lambda b=b: connected(b), within=120)
            reconnected.append(((await fleet.status(b))["connection"]["since"] - back) * 1000)

        async def flushed(b: int = ran_on, task_id: str = task_id) -> bool:
            return task_id not in (await fleet.status(b))["spooled"]

        delivered.append((await until_true(flushed, within=120) - back) * 1000)
        print(
            f"outage trial {trial}: reconnected {reconnected[-2:]} ms,"
            f" TASK_END taken {delivered[-1]:.0f} ms",
            file=sys.stderr,
        )
    return {
        "trials": trials,
        "outage_s": outage_s,
        "server_back_to_reconnected_ms": [round(f) for f in reconnected],
        "max_ms": round(max(reconnected)),
        "target_ms": 2000,
        "server_back_to_task_end_taken_ms": [round(f) for f in delivered],
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="aigcq-agent-bench-"))
    redis = EmbeddedRedis(tmp / "redis", persist=False)
    cluster = Cluster(tmp, redis.start())
    report: dict[str, Any] = {"python_speed_ms": python_speed_ms()}
    try:
        async with httpx.AsyncClient(timeout=5.0) as http:
            fleet = Fleet(cluster, http)
            report["instance_death"] = await instance_death(fleet, args.death_trials)
            report["cancel_next"] = await cancel_next(fleet, args.cancel_trials)
            report["server_back"] = await server_back(fleet, args.outage_trials, args.outage_s)
    finally:
        with contextlib.suppress(Exception):
            cluster.close()
        redis.stop()
    return report


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"death_trials": 1, "cancel_trials": 1, "outage_trials": 1, "outage_s": 6.0}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--death-trials", type=int, default=3)
    parser.add_argument("--cancel-trials", type=int, default=3)
    parser.add_argument("--outage-trials", type=int, default=2)
    parser.add_argument("--outage-s", type=float, default=40.0)
    print(json.dumps(asyncio.run(main(smoke.parse_args(parser, SMOKE))), indent=2))
