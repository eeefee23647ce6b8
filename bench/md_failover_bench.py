"""Split topology failover: SIGKILL the message-dispatcher under steady load. Prints JSON.

Real processes on 127.0.0.1 (the e2e ``Cluster`` harness): ``aigcq serve`` using
``aigcq dispatcher`` as its internal target, one ``aigcq bridge`` to the dispatcher with
``--instances`` emulated ComfyUI instances, and the RunningHub emulator as overflow. A
client submits ``--rate`` tasks/s throughout. Measures (issue's target in brackets):

* ``kill_to_first_runninghub_ms``: SIGKILL of the dispatcher → the first task the RunningHub
  emulator accepts (its own create timestamps, ``/_emulator/stats`` ``create_times``) [< 1 s];
* ``restart_to_internal_ms``: the dispatcher started again (same port, Redis prefix) → the
  first task ``aigcq serve`` sends to it again (its timeline in Redis); this includes the
  bridge reconnecting and ``AIGCQ_HEALTH_RECOVER_PASSES`` (3) passing health checks at
  ``--health-interval-ms``;
* where every task ran, and whether each result reached the client exactly once.

    python bench/md_failover_bench.py [--rate 50] [--trials 3] [--health-interval-ms 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from tests.fakes.client import Client, bridge_task
from tests.fakes.processes import MD_PASSWORD, Cluster, start_dispatcher, wait_free

from aigcq.embedded.redis import EmbeddedRedis
from aigcq.queue.keys import Keys

PREFIX = "aigcq"  # aigcq serve's default key prefix


def log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


class Load:
    """Submits ``rate`` tasks/s and reads every result, remembering when each was sent."""

    def __init__(self, client: Client, rate: float, prefix: str) -> None:
        self.client, self.rate, self.prefix = client, rate, prefix
        self.sent: dict[str, float] = {}  # taskId -> epoch s
        self.stopped = False

    async def submit(self) -> None:
        start, i = time.monotonic(), 0
        while not self.stopped:
            task_id = f"{self.prefix}-{i}"
            self.sent[task_id] = time.time()
            await self.client.send(bridge_task(task_id))
            i += 1
            await asyncio.sleep(max(0.0, start + i / self.rate - time.monotonic()))

    async def read(self) -> None:
        with contextlib.suppress(Exception):
            while True:
                await self.client.next(timeout=3600)


async def rh_creates(http: httpx.AsyncClient, rh: str) -> list[float]:
    times: list[float] = (await http.get(f"{rh}/_emulator/stats")).json()["create_times"]
    return times


async def bridge_back(http: httpx.AsyncClient, md_port: int) -> list[float]:
    """[now] once the restarted dispatcher has a bridge with instances again."""
    data = (await http.get(f"http://127.0.0.1:{md_port}/api/health")).json()["data"]
    return [time.time()] if data["instances"] > 0 else []


async def first_after(
    probe: Any, after: float, timeout: float, interval: float = 0.01
) -> float | None:
    """Poll ``probe()`` (a list of epoch times) for the first one after ``after``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        later = [t for t in await probe() if t > after]
        if later:
            return min(later)
        await asyncio.sleep(interval)
    return None


async def internal_dispatches(redis: aioredis.Redis, ids: list[str]) -> list[float]:
    """Times ``aigcq serve`` handed any of ``ids`` to the message-dispatcher."""
    keys = Keys(PREFIX)
    pipe = redis.pipeline(transaction=False)
    for task_id in ids:
        pipe.lrange(keys.timeline(task_id), 0, -1)
    out = []
    for rows in await pipe.execute():
        for row in rows:
            entry = orjson.loads(row)
            if entry["state"] == "dispatching" and entry["target"] == "message_dispatcher":
                out.append(float(entry["t"]))
    return out


async def targets(redis: aioredis.Redis, ids: list[str]) -> dict[str, str]:
    keys = Keys(PREFIX)
    pipe = redis.pipeline(transaction=False)
    for task_id in ids:
        pipe.hget(keys.task(task_id), "target")
    return {i: str(t or "") for i, t in zip(ids, await pipe.execute(), strict=True)}


async def trial(
    cluster: Cluster,
    args: argparse.Namespace,
    md_port: int,
    md: Any,
    rh: str,
    port: int,
    redis: aioredis.Redis,
    http: httpx.AsyncClient,
) -> tuple[dict[str, Any], Any]:
    client = await Client(port, f"bench-{time.monotonic_ns()}").connect()
    load = Load(client, args.rate, f"fo{time.monotonic_ns()}")
    runners = [asyncio.create_task(load.submit()), asyncio.create_task(load.read())]
    try:
        await asyncio.sleep(args.warmup_s)
        before = set(load.sent)
        md.kill()  # SIGKILL
        killed_at = time.time()
        first_rh = await first_after(lambda: rh_creates(http, rh), killed_at, 10.0)
        log(f"killed; first RunningHub create after {first_rh and first_rh - killed_at} s")
        await asyncio.sleep(max(0.0, args.down_s - (time.time() - killed_at)))
        restarted_at = time.time()
        md, _ = start_dispatcher(cluster, md_port)
        ready_at = time.time()

        async def internal_since() -> list[float]:
            recent = [i for i, t in load.sent.items() if t > restarted_at]
            return await internal_dispatches(redis, recent)

        log(f"dispatcher restarted in {ready_at - restarted_at:.2f} s")
        bridge_at = await first_after(lambda: bridge_back(http, md_port), restarted_at, 60.0, 0.05)
        back_in = await first_after(internal_since, restarted_at, args.recover_timeout_s, 0.05)
        log(f"internal again after {back_in and back_in - restarted_at} s")
        await asyncio.sleep(args.after_s)
    finally:
        load.stopped = True
        await runners[0]
    ids = list(load.sent)
    runners[1].cancel()
    await asyncio.gather(runners[1], return_exceptions=True)
    log(f"{len(ids)} tasks sent, collecting results")
    with contextlib.suppress(TimeoutError):
        await client.collect(len(ids), timeout=args.drain_s)
    await client.close()
    where = await targets(redis, ids)
    ms = lambda a, b: None if a is None else round((a - b) * 1000, 1)  # noqa: E731
    results = client.results
    report = {
        "tasks": len(ids),
        "kill_to_first_runninghub_ms": ms(first_rh, killed_at),
        "restart_to_dispatcher_up_ms": ms(ready_at, restarted_at),
        "restart_to_bridge_registered_ms": ms(bridge_at, restarted_at),
        "restart_to_internal_ms": ms(back_in, restarted_at),
        "before_kill": _count(where, before),
        "after_kill": _count(where, set(ids) - before),
        "results": len(results),
        "missing": len(set(ids) - set(results)),
        "duplicates": sum(1 for v in results.values() if len(v) > 1),
        "failed": sum(1 for v in results.values() if v[0]["status"] != "success"),
    }
    return report, md


def _count(where: dict[str, str], ids: set[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for task_id in ids:
        out[where.get(task_id) or "-"] = out.get(where.get(task_id) or "-", 0) + 1
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="aigcq-md-failover-"))
    embedded = EmbeddedRedis(tmp / "redis", persist=False)
    cluster = Cluster(tmp, embedded.start())
    redis = aioredis.from_url(cluster.redis_url, decode_responses=True)
    try:
        comfy = [
            cluster.emulator("comfyui", "--step-time", str(args.step_time), "--steps", "2")
            for _ in range(args.emulators)
        ] * (args.instances // args.emulators)
        rh = cluster.emulator("runninghub", "--max-concurrent", "10000", "--duration", "0.2")
        md, md_port = start_dispatcher(cluster)
        cluster.bridge(md_port, comfy, f"--heartbeat={args.heartbeat_s}")
        wait_free(md_port, len(comfy), timeout=60)
        log(f"dispatcher up with {len(comfy)} instances")
        cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 10000}}})
        _, port = cluster.server(
            AIGCQ_RUNNINGHUB_URL=rh,
            MESSAGE_DISPATCHER_URL=f"http://127.0.0.1:{md_port}",
            MD_PASSWORD=MD_PASSWORD,
            MESSAGE_DISPATCHER_HEALTH_CHECK_INTERVAL=str(args.health_interval_ms),
            AIGCQ_OVERFLOW_AFTER_MS=str(args.overflow_after_ms),
        )
        await asyncio.sleep(1.5)  # logged in, capacity feed connected
        trials = []
        async with httpx.AsyncClient(timeout=10) as http:
            for n in range(args.trials):
                wait_free(md_port, 1, timeout=60)
                # internal again: a recovery takes 3 passing checks
                await asyncio.sleep(4 * args.health_interval_ms / 1000)
                report, md = await trial(cluster, args, md_port, md, rh, port, redis, http)
                print(f"trial {n}: {report}", file=sys.stderr)
                trials.append(report)
        kill = [t["kill_to_first_runninghub_ms"] for t in trials]
        back = [t["restart_to_internal_ms"] for t in trials]
        return {
            "rate_per_s": args.rate,
            "instances": args.instances,
            "comfyui_emulators": args.emulators,
            "health_interval_ms": args.health_interval_ms,
            "overflow_after_ms": args.overflow_after_ms,
            "kill_to_first_runninghub_ms": kill,
            "kill_to_first_runninghub_max_ms": _max(kill),
            "target_kill_to_runninghub_ms": 1000,
            "restart_to_internal_ms": back,
            "restart_to_internal_median_ms": _median(back),
            "trials": trials,
        }
    finally:
        await redis.aclose()
        cluster.close()
        embedded.stop()


def _max(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known and len(known) == len(values) else None


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {
    "rate": 10.0,
    "health_interval_ms": 200,
    "instances": 2,
    "emulators": 1,
    "trials": 1,
    "warmup_s": 0.5,
    "down_s": 1.0,
    "after_s": 0.5,
    "drain_s": 20.0,
    "recover_timeout_s": 30.0,
}

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the processes on the way out
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=50.0, help="tasks submitted per second")
    parser.add_argument("--instances", type=int, default=16, help="bridge instances")
    parser.add_argument("--emulators", type=int, default=4, help="ComfyUI emulators they share")
    parser.add_argument("--heartbeat-s", type=float, default=0.1, help="bridge HEARTBEAT")
    parser.add_argument("--step-time", type=float, default=0.01, help="ComfyUI step time, s")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--overflow-after-ms",
        type=int,
        default=10000,
        help="while the dispatcher is healthy a task waits this long for it before it "
        "overflows: keeps the load internal until the kill on a machine too small to run "
        "--rate internally (0: overflow at once)",
    )
    parser.add_argument("--health-interval-ms", type=int, default=1000)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--down-s", type=float, default=3.0, help="dispatcher down this long")
    parser.add_argument("--after-s", type=float, default=2.0, help="load after recovery")
    parser.add_argument("--recover-timeout-s", type=float, default=60.0)
    parser.add_argument("--drain-s", type=float, default=60.0, help="wait for the last results")
    print(json.dumps(asyncio.run(main(smoke.parse_args(parser, SMOKE))), indent=2))
