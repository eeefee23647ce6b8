"""Idle and slowloris connections against a real ``aigcq serve`` (issue 25 item 9). Prints JSON.

Opens ``--idle`` connections that send nothing and ``--loris`` connections that send a
request head one header line a second and never finish it, then for ``--seconds`` probes
``GET /healthz`` on a fresh connection every 0.1 s and counts the server's open file
descriptors every 0.5 s. The server runs with an open-file limit of ``--server-nofile``
(1024, a common default), as a server on an ordinary host does.

    python bench/surfaces_bench.py [--idle 250] [--loris 250] [--seconds 25]

Figures: the server's fds at the start, at most and at the end; the probe's p50 / p99 /
max and its failures (no answer within 5 s); how many of the held connections the server
closed. Run it against another checkout (``PYTHONPATH=<other>/src``) for a before/after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from bench.processes import Cluster, wait_http

from aigcq.embedded.redis import EmbeddedRedis

PROBE_TIMEOUT_S = 5.0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def start_server(cluster: Cluster, port: int, nofile: int, env: dict[str, str]) -> Any:
    """``aigcq serve`` with its soft open-file limit set to ``nofile``."""

    def limit() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

    log = (cluster.tmp / "serve.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "aigcq", "serve"],
        env={**os.environ, **cluster.server_env(port), **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=limit,
    )
    wait_http(f"http://127.0.0.1:{port}/healthz")
    return proc


async def hold_idle(port: int, cut: list[int]) -> None:
    """A connection that sends nothing; counts itself in ``cut`` when the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await reader.read()  # returns at EOF
        cut.append(1)
    finally:
        writer.close()


async def hold_loris(port: int, cut: list[int]) -> None:
    """A request head that never ends: one header line a second."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        for i in range(10_000):
            await asyncio.sleep(1.0)
            if reader.at_eof() or writer.is_closing():
                break
            writer.write(b"X-Loris-%d: 1\r\n" % i)
            try:
                await writer.drain()
            except ConnectionError:
                break
        cut.append(1)
    except ConnectionError:
        cut.append(1)
    finally:
        writer.close()


async def probe(port: int) -> float | None:
    """Seconds for ``GET /healthz`` on a fresh connection; ``None`` if no 200 in time."""
    start = time.perf_counter()
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
            writer.close()
    except (TimeoutError, OSError):
        return None
    return time.perf_counter() - start if answer.startswith(b"HTTP/1.1 200") else None


async def attack(port: int, pid: int, idle: int, loris: int, seconds: float) -> dict[str, Any]:
    before = fds(pid)
    idle_cut: list[int] = []
    loris_cut: list[int] = []
    holders = [asyncio.create_task(hold_idle(port, idle_cut)) for _ in range(idle)]
    holders += [asyncio.create_task(hold_loris(port, loris_cut)) for _ in range(loris)]
    samples: list[int] = []
    latencies: list[float] = []
    failures = 0
    end = time.monotonic() + seconds
    next_fd = 0.0
    while time.monotonic() < end:
        if time.monotonic() >= next_fd:
            samples.append(fds(pid))
            next_fd = time.monotonic() + 0.5
        took = await probe(port)
        if took is None:
            failures += 1
        else:
            latencies.append(took)
        await asyncio.sleep(0.1)
    after = fds(pid)
    for h in holders:
        h.cancel()
    await asyncio.gather(*holders, return_exceptions=True)
    ordered = sorted(latencies)
    return {
        "server_fds_before": before,
        "server_fds_max": max(samples),
        "server_fds_end": after,
        "probes": len(latencies) + failures,
        "probe_failures": failures,
        "probe_p50_ms": round(statistics.median(ordered) * 1000, 1) if ordered else None,
        "probe_p99_ms": round(ordered[int(len(ordered) * 0.99)] * 1000, 1) if ordered else None,
        "probe_max_ms": round(ordered[-1] * 1000, 1) if ordered else None,
        "idle_cut_by_server": len(idle_cut),
        "loris_cut_by_server": len(loris_cut),
    }


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"idle": 5, "loris": 5, "seconds": 2.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=250, help="connections that send nothing")
    parser.add_argument("--loris", type=int, default=250, help="slowloris connections")
    parser.add_argument("--seconds", type=float, default=25.0, help="how long to probe")
    parser.add_argument("--server-nofile", type=int, default=1024, help="server's fd limit")
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="server setting"
    )
    args = smoke.parse_args(parser, SMOKE)
    env = dict(item.split("=", 1) for item in args.env)
    with tempfile.TemporaryDirectory() as tmp:
        redis = EmbeddedRedis(Path(tmp) / "redis", persist=False)
        cluster = Cluster(Path(tmp), redis.start())
        cluster.write_models({"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}})
        port = cluster.ports.take()
        proc = start_server(cluster, port, args.server_nofile, env)
        try:
            figures = asyncio.run(attack(port, proc.pid, args.idle, args.loris, args.seconds))
        finally:
            proc.terminate()
            proc.wait(15)
            redis.stop()
    settings = {"idle": args.idle, "loris": args.loris, "seconds": args.seconds}
    print(json.dumps({**settings, "server_nofile": args.server_nofile, "env": env, **figures}))


if __name__ == "__main__":
    main()
