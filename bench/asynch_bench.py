"""End-to-end benchmark of ``aigcq asynch``: createTask → result with an instant model service.

Starts a private PostgreSQL and Redis, a model-service emulator (latency 0) and two
``aigcq asynch`` worker processes, sends ``--tasks`` createTask calls (alternating between the
two processes, ``--concurrency`` in flight) while collecting results with getTaskBatch, and
prints JSON: end-to-end throughput and createTask latency percentiles.

Run from the repository root: ``python bench/asynch_bench.py [--tasks 3000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.asynch.processes import free_port, start_asynch, stop

from aigcq.embedded.postgres import EmbeddedPostgres
from aigcq.embedded.redis import EmbeddedRedis


def start_model_service() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    code = "from aigcq.cli import main; main()"
    args = [sys.executable, "-c", code, "emulate", "model-service", "--port", str(port)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(f"{url}/_emulator/stats", timeout=1)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("model service emulator did not start")


async def drive(urls: list[str], model_url: str, tasks: int, concurrency: int) -> dict[str, float]:
    limits = httpx.Limits(
        max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8
    )
    async with httpx.AsyncClient(timeout=60, limits=limits) as c:
        model = {"modelName": "bench", "baseUrl": model_url, "route": "/gen",
                 "maxConcurrency": 200, "queueLimit": 1_000_000}  # fmt: skip
        (await c.post(f"{urls[0]}/model/createModel", json=model)).raise_for_status()
        latencies: list[float] = []
        pending: set[str] = set()
        created = asyncio.Event()
        counter = iter(range(tasks))

        async def creator() -> None:
            for i in counter:
                body = {"modelName": "bench", "requestPayload": {"i": i}, "bizName": "bench"}
                t0 = time.perf_counter()
                r = await c.post(f"{urls[i % len(urls)]}/task/createTask", json=body)
                latencies.append(time.perf_counter() - t0)
                pending.add(r.json()["data"]["task_id"])

        async def collector() -> int:
            done = 0
            while not (created.is_set() and not pending):
                batch = list(itertools.islice(pending, 500))
                if batch:
                    r = await c.post(f"{urls[0]}/task/getTaskBatch", json={"taskIds": batch})
                    for t in r.json()["data"]["tasks"]:
                        if t["state"] in (3, 4):
                            pending.discard(t["task_id"])
                            done += 1
                await asyncio.sleep(0.05)
            return done

        start = time.perf_counter()
        collecting = asyncio.create_task(collector())
        await asyncio.gather(*(creator() for _ in range(concurrency)))
        create_seconds = time.perf_counter() - start
        created.set()
        done = await collecting
        total = time.perf_counter() - start
    ordered = sorted(latencies)
    return {
        "tasks": done,
        "wall_seconds": round(total, 3),
        "throughput_tasks_per_s": round(done / total, 1),
        "create_rate_per_s": round(tasks / create_seconds, 1),
        "create_p50_ms": round(statistics.median(ordered) * 1000, 2),
        "create_p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--durable", action="store_true", help="PostgreSQL with fsync on")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="aigcq-bench-"))
    root.chmod(0o755)  # PostgreSQL's unprivileged user must reach pg/ when we are root
    pg = EmbeddedPostgres(root / "pg", fast=not args.durable)
    redis = EmbeddedRedis(root / "redis", persist=False)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        db_url, redis_url = pg.start(), redis.start()
        model_proc, model_url = start_model_service()
        procs.append(model_proc)
        urls = []
        for i in range(args.workers):
            proc, url = start_asynch(db_url, redis_url, root, log=root / f"asynch-{i}.log")
            procs.append(proc)
            urls.append(url)
        result = asyncio.run(drive(urls, model_url, args.tasks, args.concurrency))
        result.update(workers=args.workers, concurrency=args.concurrency,
                      postgres="durable" if args.durable else "fsync=off")  # fmt: skip
        print(json.dumps(result))
    finally:
        for proc in procs:
            stop(proc)
        redis.stop()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
