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
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from bench.host import cpu_seconds, python_speed_ms
from tests.fakes.processes import ASYNCH_ADMIN_TOKEN, reserved_port, start_asynch, stop

from aigcq.embedded.postgres import EmbeddedPostgres
from aigcq.embedded.redis import EmbeddedRedis

POLL_SECONDS = 0.25  # getTaskBatch period of the result collector (each poll costs server CPU)


def backing_cpu_seconds(pg: EmbeddedPostgres, redis: EmbeddedRedis) -> float:
    """CPU time so far of PostgreSQL (postmaster and its live backends, each its own process
    group) and Redis."""
    postmaster = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
    pids = {postmaster, redis._proc.pid}  # type: ignore[union-attr]
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid = int(stat.parent.name)
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        if pid in pids or int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def start_model_service() -> tuple[subprocess.Popen[bytes], str]:
    port = reserved_port()
    code = "from aigcq.cli.entry import main; main()"
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


async def drive(
    urls: list[str], model_url: str, tasks: int, concurrency: int, rate: float
) -> dict[str, float]:
    # aiohttp: with httpx the client itself saturated a core (its pool is O(connections) per
    # request) and became the bottleneck of the measurement
    connector = aiohttp.TCPConnector(limit=concurrency + 8)
    async with aiohttp.ClientSession(connector=connector) as c:
        model = {"modelName": "bench", "baseUrl": model_url, "route": "/gen",
                 "maxConcurrency": 200, "queueLimit": 1_000_000}  # fmt: skip
        admin = {"Authorization": f"Bearer {ASYNCH_ADMIN_TOKEN}"}
        async with c.post(f"{urls[0]}/model/createModel", json=model, headers=admin) as r:
            r.raise_for_status()
        latencies: list[float] = []
        pending: set[str] = set()
        created = asyncio.Event()
        counter = iter(range(tasks))
        start = time.perf_counter()

        async def creator() -> None:
            for i in counter:
                if rate:  # open loop: task i is due at start + i / rate
                    await asyncio.sleep(start + i / rate - time.perf_counter())
                body = {"modelName": "bench", "requestPayload": {"i": i}, "bizName": "bench"}
                t0 = time.perf_counter()
                async with c.post(f"{urls[i % len(urls)]}/task/createTask", json=body) as r:
                    reply = await r.json()
                latencies.append(time.perf_counter() - t0)
                pending.add(reply["data"]["task_id"])

        async def collector() -> int:
            done = 0
            while not (created.is_set() and not pending):
                batch = list(itertools.islice(pending, 500))
                if batch:
                    url = f"{urls[0]}/task/getTaskBatch"
                    async with c.post(url, json={"taskIds": batch}) as r:
                        reply = await r.json()
                    for t in reply["data"]:
                        if t["state"] in (3, 4):
                            pending.discard(t["task_id"])
                            done += 1
                await asyncio.sleep(POLL_SECONDS)
            return done

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


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"tasks": 20, "concurrency": 4, "workers": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--rate",
        type=float,
        default=0,
        help="open loop: send createTask at this many per second (at most --concurrency in"
        " flight) so latency is measured at a given load; 0 (default): closed loop, as fast"
        " as --concurrency allows",
    )
    parser.add_argument("--durable", action="store_true", help="PostgreSQL with fsync on")
    args = smoke.parse_args(parser, SMOKE)
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
        host_before = python_speed_ms()
        server_pids = [p.pid for p in procs[1:]]
        cpu_before = [cpu_seconds(pid) for pid in server_pids]
        model_before = cpu_seconds(model_proc.pid)
        backing_before = backing_cpu_seconds(pg, redis)
        client_before = time.process_time()
        result = asyncio.run(drive(urls, model_url, args.tasks, args.concurrency, args.rate))
        client_cpu = time.process_time() - client_before
        server_cpu = sum(cpu_seconds(pid) for pid in server_pids) - sum(cpu_before)
        model_cpu = cpu_seconds(model_proc.pid) - model_before
        backing_cpu = backing_cpu_seconds(pg, redis) - backing_before
        done = max(int(result["tasks"]), 1)
        for name, seconds in [("server", server_cpu), ("model", model_cpu),
                              ("pg_redis", backing_cpu), ("client", client_cpu)]:  # fmt: skip
            result[f"{name}_cpu_ms_per_task"] = round(seconds * 1000 / done, 3)
        result.update(workers=args.workers, concurrency=args.concurrency, rate=args.rate,
                      postgres="durable" if args.durable else "fsync=off",
                      host_python_ms=[host_before, python_speed_ms()])  # fmt: skip
        print(json.dumps(result))
    finally:
        for proc in procs:
            stop(proc)
        redis.stop()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
