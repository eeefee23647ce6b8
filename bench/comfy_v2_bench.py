"""Submit-to-result overhead of the Comfy API v2 door against the seed WebSocket path, on
the same fleet, and SSE fan-out.

Real processes on a private Redis: ``aigcq serve``, two ComfyUI emulators finishing at once
(``--step-time 0.001 --steps 1``) behind one ``aigcq bridge``. The same graph (with a
fresh value each time, so ComfyUI's cache never answers) goes

* ``seed``: over the seed WebSocket (``generate`` with an inline ``workflow``) to its
  ``result`` message;
* ``v2_events``: through the unchanged ``comfy-sdk`` (``AsyncComfy.submit``, then
  ``job.events()`` to the terminal status, then one ``refresh`` for the outputs);
* ``v2_wait``: the same with ``job.wait()``, the SDK's polling (0.5 s first backoff).

one task at a time (latency), then ``--watchers`` event streams on one job (fan-out: the
job is held waiting by a pause, the streams opened, then the pause lifted: the time until
every stream saw its terminal status).

    python bench/comfy_v2_bench.py [--tasks 30] [--watchers 500]

Prints JSON; compare only runs whose ``host_python_ms`` agree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from comfy_sdk import AsyncComfy
from comfy_sdk.workflows import Workflow

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from bench.host import python_speed_ms
from bench.processes import ADMIN_TOKEN, CLIENT_TOKEN, Cluster, wait_http
from tests.fakes.client import Client, generate
from tests.fakes.comfyui import invert_graph

from aigcq.embedded.redis import EmbeddedRedis

QUIET = ("--log-level", "WARNING")
#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"tasks": 2, "watchers": 5}


def graph(i: int) -> dict[str, Any]:
    g = invert_graph(f"b{i}")
    g["1"]["inputs"]["color"] = i  # a new prompt each time: no cached node outputs
    return g


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": pct(values, 0.5), "p95_ms": pct(values, 0.95), "mean_ms": round(
        statistics.fmean(values), 1)}  # fmt: skip


async def seed(port: int, n: int) -> list[float]:
    client = await Client(port, "bench-seed", CLIENT_TOKEN).connect()
    times = []
    try:
        for i in range(n):
            t0 = time.perf_counter()
            await client.request(generate(f"seed-{i}", aigc="aigcq", workflow=graph(i)))
            while True:
                message = await client.next(timeout=30)
                if message.get("type") == "result" and message.get("taskId") == f"seed-{i}":
                    break
            assert message["status"] == "success", message
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        await client.close()
    return times


async def v2(sdk: AsyncComfy, n: int, offset: int, *, events: bool) -> list[float]:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        job = await sdk.submit(Workflow(graph(offset + i)))
        if events:
            async for _event in job.events():
                pass
            await job.refresh()
        else:
            await job.wait(timeout=60)
        assert job.status == "succeeded" and job.outputs, job
        times.append((time.perf_counter() - t0) * 1000)
    return times


async def fan_out(base: str, sdk: AsyncComfy, watchers: int) -> dict[str, Any]:
    """``watchers`` SSE streams on one job held waiting (its project paused), then
    resumed: from the resume until every stream saw the terminal status."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    pause = {"kind": "project", "name": "aigcq"}
    ends: list[float] = []
    opened = asyncio.Event()
    open_count = 0
    limits = httpx.Limits(max_connections=watchers + 10)
    headers = {"Authorization": f"Bearer {CLIENT_TOKEN}", "Accept": "text/event-stream"}
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=120) as http:
        (await http.post("/api/admin/pause", json=pause, headers=admin)).raise_for_status()
        job = await sdk.submit(Workflow(graph(10_000)))

        async def watch() -> None:
            nonlocal open_count
            async with http.stream("GET", f"/api/v2/jobs/{job.id}/events", headers=headers) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data:") and '"status":"queued"' in line:
                        open_count += 1
                        if open_count == watchers:
                            opened.set()
                    if line.startswith("data:") and '"status":"succeeded"' in line:
                        ends.append(time.perf_counter())
                        return

        t_open = time.perf_counter()
        streams = [asyncio.create_task(watch()) for _ in range(watchers)]
        await asyncio.wait_for(opened.wait(), 120)
        opened_s = time.perf_counter() - t_open
        t0 = time.perf_counter()
        (await http.post("/api/admin/resume", json=pause, headers=admin)).raise_for_status()
        await asyncio.wait_for(asyncio.gather(*streams), 120)
    return {
        "watchers": watchers,
        "all_saw_the_end": len(ends) == watchers,
        "open_all_s": round(opened_s, 2),
        "resume_to_first_end_ms": round((min(ends) - t0) * 1000, 1),
        "resume_to_last_end_ms": round((max(ends) - t0) * 1000, 1),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    yardstick = [python_speed_ms()]
    tmp = Path(tempfile.mkdtemp(prefix="comfy-v2-bench-"))
    redis = EmbeddedRedis(tmp / "redis", persist=False)
    cluster = Cluster(tmp, redis.start())
    try:
        cluster.write_models({"aigcq": {"comfyui": {"apikey": "k", "concurrency": 0}}})
        _, port = cluster.server()
        fast = ("--step-time", "0.001", "--steps", "1", *QUIET)
        comfy = [cluster.emulator("comfyui", *fast) for _ in range(2)]
        _, bridge_port = cluster.bridge(port, comfy)
        wait_http(f"http://127.0.0.1:{bridge_port}/api/status")
        await asyncio.sleep(1.0)  # the hub has its REGISTER
        base = f"http://127.0.0.1:{port}"
        os.environ["COMFY_BASE_URL"] = base
        seed_ms = await seed(port, args.tasks)
        async with AsyncComfy(api_key=CLIENT_TOKEN, timeout=30.0) as sdk:
            events_ms = await v2(sdk, args.tasks, 1000, events=True)
            wait_ms = await v2(sdk, args.tasks, 2000, events=False)
            fan = await fan_out(base, sdk, args.watchers) if args.watchers else None
        result = {
            "tasks": args.tasks,
            "seed": summary(seed_ms),
            "v2_events": summary(events_ms),
            "v2_wait": summary(wait_ms),
            "v2_events_over_seed_p50": round(pct(events_ms, 0.5) / pct(seed_ms, 0.5), 2),
            "v2_wait_over_seed_p50": round(pct(wait_ms, 0.5) / pct(seed_ms, 0.5), 2),
            "fan_out": fan,
        }
    finally:
        cluster.close()
        redis.stop()
    yardstick.append(python_speed_ms())
    return {**result, "host_python_ms": yardstick}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=30)
    parser.add_argument("--watchers", type=int, default=500)
    args = smoke.parse_args(parser, SMOKE)
    print(json.dumps(asyncio.run(main(args)), indent=2), file=sys.stdout)
