"""httpx vs aiohttp against the RunningHub emulator: why the platform hot path uses aiohttp.

python bench/http_clients.py [--requests 3000] [--in-flight 64]   # JSON requests/s per client
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import uvicorn
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from bench.processes import reserved_port, wait_http

from aigcq.emulators.runninghub import RunningHubEmulatorConfig, create_app

#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"requests": 50, "in_flight": 8}


def run_emulator(port: int) -> None:
    config = RunningHubEmulatorConfig(duration_s=1000, max_concurrent=10**9)
    uvicorn.run(create_app(config), port=port, log_level="warning", loop="uvloop")


async def measure(port: int, requests: int, in_flight: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/task/openapi/status"
    body = {"apiKey": "k", "taskId": "1"}
    slots = asyncio.Semaphore(in_flight)
    report: dict[str, Any] = {"requests": requests, "in_flight": in_flight}
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=in_flight)) as client:

        async def with_httpx() -> None:
            async with slots:
                (await client.post(url, json=body)).json()

        start = time.perf_counter()
        await asyncio.gather(*(with_httpx() for _ in range(requests)))
        report["httpx_per_s"] = round(requests / (time.perf_counter() - start), 1)
    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def with_aiohttp() -> None:
            async with session.post(url, json=body) as resp:
                await resp.json()

        start = time.perf_counter()
        await asyncio.gather(*(with_aiohttp() for _ in range(requests)))
        report["aiohttp_per_s"] = round(requests / (time.perf_counter() - start), 1)
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=3000, help="per client")
    parser.add_argument("--in-flight", type=int, default=64)
    args = smoke.parse_args(parser, SMOKE)
    port = reserved_port()
    emulator = multiprocessing.Process(target=run_emulator, args=(port,))
    emulator.start()
    try:
        wait_http(f"http://127.0.0.1:{port}/_emulator/stats")
        print(json.dumps(uvloop.run(measure(port, args.requests, args.in_flight)), indent=2))
    finally:
        emulator.terminate()
