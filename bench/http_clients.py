"""httpx vs aiohttp against the RunningHub emulator: why the platform hot path uses aiohttp.

python bench/http_clients.py      # prints JSON requests/s for each client
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import socket
import time
from typing import Any

import aiohttp
import httpx
import uvicorn
import uvloop

from aigcq.emulators.runninghub import RunningHubEmulatorConfig, create_app

REQUESTS = 3000
IN_FLIGHT = 64


def run_emulator(port: int) -> None:
    config = RunningHubEmulatorConfig(duration_s=1000, max_concurrent=10**9)
    uvicorn.run(create_app(config), port=port, log_level="warning", loop="uvloop")


async def measure(port: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/task/openapi/status"
    body = {"apiKey": "k", "taskId": "1"}
    slots = asyncio.Semaphore(IN_FLIGHT)
    report: dict[str, Any] = {"requests": REQUESTS, "in_flight": IN_FLIGHT}
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=IN_FLIGHT)) as client:

        async def with_httpx() -> None:
            async with slots:
                (await client.post(url, json=body)).json()

        start = time.perf_counter()
        await asyncio.gather(*(with_httpx() for _ in range(REQUESTS)))
        report["httpx_per_s"] = round(REQUESTS / (time.perf_counter() - start), 1)
    connector = aiohttp.TCPConnector(limit=IN_FLIGHT)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def with_aiohttp() -> None:
            async with session.post(url, json=body) as resp:
                await resp.json()

        start = time.perf_counter()
        await asyncio.gather(*(with_aiohttp() for _ in range(REQUESTS)))
        report["aiohttp_per_s"] = round(REQUESTS / (time.perf_counter() - start), 1)
    return report


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    emulator = multiprocessing.Process(target=run_emulator, args=(port,))
    emulator.start()
    time.sleep(2)
    try:
        print(json.dumps(uvloop.run(measure(port)), indent=2))
    finally:
        emulator.terminate()
