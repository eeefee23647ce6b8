"""Submit -> result through the RunningHub emulator at instant completion. Prints JSON.

Measures: sustained throughput (open loop, as fast as possible), p50/p99 latency at a
paced rate, server RSS, and Redis memory per waiting task at two backlog sizes.

    python bench/submit_bench.py [--tasks 3000] [--rate 500] [--waiting 100,100000]
    python bench/submit_bench.py --replica   # the cost of AIGCQ_REDIS_MIN_REPLICAS

``--replica``: Redis is a master with one replica over loopback TCP; the same load runs
against a server with ``AIGCQ_REDIS_MIN_REPLICAS`` 0 and then one with 1 (every submit,
paid create and TASK_END waits for the replica's WAIT).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from bench.host import cpu_seconds, python_speed_ms, rss_kib
from tests.fakes.client import Client, generate
from tests.fakes.processes import Cluster
from tests.fakes.sentinel import SentinelGroup

from aigcq.embedded.redis import EmbeddedRedis


async def run_load(
    port: int,
    n: int,
    rate: float | None,
    clients: int = 4,
    pid: int | None = None,
    redis_pid: int | None = None,
) -> dict[str, Any]:
    """Submit ``n`` tasks over ``clients`` sockets; latency = submit -> result.

    With ``pid`` (the server's), also its CPU time per task: the wall figures depend on
    whatever else runs on the machine, this one much less. With ``redis_pid``, Redis's
    CPU per task too, and so the tasks per second one Redis core carries (when to add a
    cell: docs/topologies.md).
    """
    cpu = cpu_seconds(pid) if pid else 0.0
    redis_cpu = cpu_seconds(redis_pid) if redis_pid else 0.0
    run = time.time_ns()
    conns = [await Client(port, f"bench-{run}-{i}").connect() for i in range(clients)]
    sent: dict[str, float] = {}
    done: dict[str, float] = {}
    duplicates = 0

    async def reader(c: Client) -> None:
        while len(done) < n:  # the first reader to see the n-th result ends the run
            msg = orjson.loads(await c.ws.recv())
            if msg["type"] == "result":
                nonlocal duplicates
                duplicates += msg["taskId"] in done
                done[msg["taskId"]] = time.perf_counter()

    readers = [asyncio.create_task(reader(c)) for c in conns]
    start = time.perf_counter()
    for i in range(n):
        tid = f"b{time.time_ns()}-{i}"
        sent[tid] = time.perf_counter()
        await conns[i % clients].send(generate(tid))
        if rate:
            await asyncio.sleep(max(0.0, start + (i + 1) / rate - time.perf_counter()))
    await asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED)
    elapsed = time.perf_counter() - start
    for r in readers:
        r.cancel()
    for c in conns:
        await c.close()
    lat = sorted((done[t] - sent[t]) * 1000 for t in sent)
    report: dict[str, Any] = {
        "tasks": n,
        "seconds": round(elapsed, 3),
        "throughput_per_s": round(n / elapsed, 1),
        "p50_ms": round(statistics.median(lat), 2),
        "p99_ms": round(lat[int(len(lat) * 0.99) - 1], 2),
        "duplicates": duplicates,
    }
    if pid:
        report["server_cpu_ms_per_task"] = round((cpu_seconds(pid) - cpu) * 1000 / n, 3)
    if redis_pid:
        per_task_s = (cpu_seconds(redis_pid) - redis_cpu) / n
        report["redis_cpu_ms_per_task"] = round(per_task_s * 1000, 3)
        report["tasks_per_s_per_redis_core"] = round(1 / per_task_s) if per_task_s else None
    return report


async def memory_per_waiting_task(redis_url: str, port: int, waiting: int) -> dict[str, Any]:
    """Fill a queue nothing dispatches (concurrency 0) and read Redis memory growth."""
    redis = aioredis.Redis.from_url(redis_url)
    before = (await redis.info("memory"))["used_memory"]
    client = await Client(port, "bench-mem").connect()
    start = time.perf_counter()
    batch = 500
    for i in range(0, waiting, batch):
        for j in range(i, min(i + batch, waiting)):
            await client.send(generate(f"w{waiting}-{j}", aigc="idle"))
        for _ in range(i, min(i + batch, waiting)):
            await client.next(timeout=60)
    elapsed = time.perf_counter() - start
    after = (await redis.info("memory"))["used_memory"]
    await client.close()
    await redis.aclose()
    return {
        "waiting": waiting,
        "redis_bytes_per_task": round((after - before) / waiting, 1),
        "submit_us_per_task": round(elapsed / waiting * 1e6, 1),
    }


def paced_tasks(args: argparse.Namespace) -> int:
    return max(1, int(args.rate * args.paced_s))


MODELS = {
    "proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 1000}},
    "idle": {"comfyui": {"apikey": "k" * 32, "concurrency": 0}},
}


async def replica_cost(args: argparse.Namespace) -> dict[str, Any]:
    """The same load with ``AIGCQ_REDIS_MIN_REPLICAS`` 0 and 1, on a replicated Redis."""
    tmp = Path(tempfile.mkdtemp(prefix="aigcq-bench-"))
    with SentinelGroup(tmp / "redis", sentinel_count=0) as pair:
        cluster = Cluster(tmp, pair.url)
        try:
            rh = cluster.emulator("runninghub", "--max-concurrent", "100000", "--duration", "0")
            cluster.write_models(MODELS)
            report: dict[str, Any] = {"host_python_ms": [python_speed_ms()]}
            for min_replicas in ("0", "1"):
                server, port = cluster.server(
                    AIGCQ_RUNNINGHUB_URL=rh,
                    AIGCQ_SWEEP_INTERVAL_S="1",
                    AIGCQ_REDIS_MIN_REPLICAS=min_replicas,
                )
                assert server.p is not None
                await run_load(port, args.warmup, None)  # warm-up
                pid, master = server.p.pid, pair.nodes[0].proc
                assert master is not None
                runs = {
                    "sustained": await run_load(
                        port, args.tasks, None, pid=pid, redis_pid=master.pid
                    ),
                    "paced": await run_load(
                        port, int(args.rate * args.paced_s), args.rate, pid=pid
                    ),
                }
                report[f"min_replicas_{min_replicas}"] = runs
                print(min_replicas, runs, file=sys.stderr)
                server.stop()
            report["host_python_ms"].append(python_speed_ms())
            return report
        finally:
            cluster.close()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    if args.replica:
        return await replica_cost(args)
    tmp = Path(tempfile.mkdtemp(prefix="aigcq-bench-"))
    redis = EmbeddedRedis(tmp / "redis", persist=False)
    cluster = Cluster(tmp, redis.start())
    try:
        rh = cluster.emulator("runninghub", "--max-concurrent", "100000", "--duration", "0")
        cluster.write_models(MODELS)
        server, port = cluster.server(AIGCQ_RUNNINGHUB_URL=rh, AIGCQ_SWEEP_INTERVAL_S="1")
        assert server.p is not None
        await run_load(port, args.warmup, None)  # warm-up
        report: dict[str, Any] = {"host_python_ms": [python_speed_ms()]}
        pid = server.p.pid
        assert redis._proc is not None
        report["sustained"] = await run_load(
            port, args.tasks, None, pid=pid, redis_pid=redis._proc.pid
        )
        print("sustained", report["sustained"], file=sys.stderr)
        report["paced"] = await run_load(port, paced_tasks(args), args.rate, pid=pid)
        print("paced", report["paced"], file=sys.stderr)
        report["server_rss_kib"] = rss_kib(server.p.pid)
        report["waiting"] = [
            await memory_per_waiting_task(cluster.redis_url, port, int(w))
            for w in args.waiting.split(",")
        ]
        report["host_python_ms"].append(python_speed_ms())
        return report
    finally:
        cluster.close()
        redis.stop()


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"tasks": 20, "rate": 20, "waiting": "10", "paced_s": 0.5, "warmup": 5}

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--waiting", default="100,10000")
    parser.add_argument("--replica", action="store_true", help="measure MIN_REPLICAS 0 vs 1")
    parser.add_argument("--paced-s", type=float, default=4.0, help="seconds of the paced run")
    parser.add_argument("--warmup", type=int, default=200, help="tasks before measuring")
    print(json.dumps(asyncio.run(main(smoke.parse_args(parser, SMOKE))), indent=2))
