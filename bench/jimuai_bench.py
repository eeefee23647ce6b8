"""Submit -> result through the JimuAI emulator at instant completion. Prints JSON.

Real processes (``aigcq serve``, ``aigcq emulate jimuai`` checking every signature), a
private Redis. Two runs: a fixed short poll interval (how fast the path itself is) and the
seed's adaptive 5-30 s interval (what an operator gets by default). For each: tasks per
second, and the poller's get-result requests per finished task (1.0 = each task asked
once; more means it was asked again before its result was due).

    python bench/jimuai_bench.py [--tasks 1000] [--concurrency 50] [--interval 0.05]
                                 [--adaptive-tasks 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from bench.host import cpu_seconds, python_speed_ms
from tests.fakes.client import Client, generate
from tests.fakes.processes import Cluster

from aigcq.embedded.redis import EmbeddedRedis

AK, SK = "AKLTbench", "bench-secret"


async def run_load(port: int, n: int) -> float:
    """Submit ``n`` jimuai tasks on one socket; seconds until the last result."""
    client = await Client(port, f"bench-{time.time_ns()}").connect()
    done: set[str] = set()
    start = time.perf_counter()
    for i in range(n):
        await client.send(generate(f"jb{time.time_ns()}-{i}", platform="jimuai", prompt=f"p{i}"))
    while len(done) < n:
        msg = orjson.loads(await asyncio.wait_for(client.ws.recv(), 120))
        if msg["type"] == "error":
            raise RuntimeError(msg)
        if msg["type"] == "result":
            assert msg["status"] == "success", msg
            done.add(msg["taskId"])
    elapsed = time.perf_counter() - start
    await client.close()
    return elapsed


async def scenario(tmp: Path, n: int, cap: int, interval: float | None) -> dict[str, Any]:
    redis = EmbeddedRedis(tmp / "redis")
    cluster = Cluster(tmp, redis.start())
    try:
        jimu = cluster.emulator(
            "jimuai",
            *("--access-key", AK, "--secret-key", SK, "--duration", "0"),
            *("--max-concurrent", str(cap), "--log-level", "WARNING"),
        )
        account = {"access_key": AK, "secret_key": SK, "concurrency": cap, "req_key": "k"}
        cluster.write_models({"proj": {"jimuai": account}})
        env = {"AIGCQ_JIMUAI_URL": jimu, "AIGCQ_PROJECT_PREFIX": "bench"}
        if interval is not None:
            env["AIGCQ_POLL_INTERVAL_S"] = str(interval)
        server, port = cluster.server(**env)
        assert server.p is not None
        cpu = cpu_seconds(server.p.pid)
        elapsed = await run_load(port, n)
        cpu = cpu_seconds(server.p.pid) - cpu
        async with httpx.AsyncClient() as http:
            stats = (await http.get(f"{jimu}/_emulator/stats")).json()
        return {
            "tasks": n,
            "concurrency": cap,
            "poll_interval_s": interval if interval is not None else "adaptive 5-30",
            "seconds": round(elapsed, 3),
            "tasks_per_s": round(n / elapsed, 1),
            "server_cpu_ms_per_task": round(cpu * 1000 / n, 2),
            "submits": stats.get("submits", 0),
            "concurrency_refusals": stats.get("code_50430", 0),
            "polls": stats.get("polls", 0),
            "polls_per_finished_task": round(stats.get("polls", 0) / n, 3),
            "peak_running": stats.get("peak_running", 0),
            "created_twice": len(stats.get("duplicates", {})),
        }
    finally:
        cluster.close()
        redis.stop()


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"tasks": 10, "concurrency": 5, "adaptive_tasks": 0}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--adaptive-tasks", type=int, default=100)
    args = smoke.parse_args(parser, SMOKE)
    report: dict[str, Any] = {"host_python_ms": [python_speed_ms()]}
    with tempfile.TemporaryDirectory() as tmp:
        report["fixed_interval"] = await scenario(
            Path(tmp) / "fixed", args.tasks, args.concurrency, args.interval
        )
        if args.adaptive_tasks:
            report["adaptive_interval"] = await scenario(
                Path(tmp) / "adaptive", args.adaptive_tasks, args.concurrency, None
            )
    report["host_python_ms"].append(python_speed_ms())
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
