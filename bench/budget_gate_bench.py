"""What the budget check costs a paid create: ``begin_create`` with no budget and with every
limit (a project's and an account's day and month, a balance floor). Prints JSON.

    python bench/budget_gate_bench.py [--tasks 3000]

Each create is claimed and then begun, one at a time, on an embedded Redis; the figures are
the mean wall time of ``begin_create`` and Redis's CPU per call (less noisy on a busy host).
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

import orjson
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from bench.host import cpu_seconds, python_speed_ms

from aigcq.embedded.redis import EmbeddedRedis
from aigcq.queue.store import TaskStore

GATE = {
    "project": "proj",
    "target": "runninghub",
    "account": "4cd3a159508c",
    "limits": [["p", "day", 50], ["a", "day", 30], ["p", "month", 800], ["a", "month", 500]],
    "day": "2026-12-03",
    "month": "2026-12",
    "floor": 2000,
    "hold": True,
}


async def begin_all(
    store: TaskStore, n: int, gate: str, tag: str, redis_pid: int
) -> dict[str, Any]:
    """Submit and claim ``n`` tasks, then time ``begin_create`` of each."""
    for i in range(n):
        await store.submit(
            f"{tag}{i}", aigc="proj", platform="comfyui", backend_id="b",
            payload={"workflowId": "1"}, deliver=False,
        )  # fmt: skip
    claimed = await store.claim("proj", "comfyui", "runninghub", cap=-1, n=n, deadline_s=60)
    cpu = cpu_seconds(redis_pid)
    start = time.perf_counter()
    for c in claimed:
        assert await store.begin_create(
            c.task_id, c.attempt, f"c-{c.task_id}", deadline_s=60, gate=gate
        )
    wall = time.perf_counter() - start
    return {
        "creates": len(claimed),
        "begin_create_us": round(wall / len(claimed) * 1e6, 1),
        "redis_cpu_us": round((cpu_seconds(redis_pid) - cpu) / len(claimed) * 1e6, 1),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="aigcq-budget-bench-"))
    redis_server = EmbeddedRedis(tmp / "redis", persist=False)
    url = redis_server.start()
    redis = aioredis.from_url(url)
    try:
        store = TaskStore(redis, "bench", retention_s=3600, outbox_retention_s=3600)
        pid = int((await redis.info("server"))["process_id"])
        # spend below every limit, a balance above the floor: every create passes the check
        await redis.hset("bench:spend:day:2026-12-03", '["p","proj","amount"]', 10)
        await redis.hset("bench:account:runninghub:4cd3a159508c", "remainCoins", 177814)
        report: dict[str, Any] = {"python_speed_ms": python_speed_ms(), "tasks": args.tasks}
        report["no_budget"] = await begin_all(store, args.tasks, "", "n", pid)
        report["every_limit"] = await begin_all(
            store, args.tasks, orjson.dumps(GATE).decode(), "g", pid
        )
        return report
    finally:
        await redis.aclose()
        redis_server.stop()


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"tasks": 30}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000)
    print(json.dumps(asyncio.run(main(smoke.parse_args(parser, SMOKE))), indent=2))
