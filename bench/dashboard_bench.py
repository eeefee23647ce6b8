"""What the dashboard's live task list costs (``GET /api/admin/live-tasks``, read once a
second by each open dashboard): one page of 50 read from a private Redis holding
``--waiting`` tasks in a wait list and ``--in-flight`` tasks claimed by a paid target.
Prints JSON: the median and p90 milliseconds of a page (first page, last page, in flight
only) over ``--rounds`` reads, in-process (no HTTP), beside the host's yardstick.

    python bench/dashboard_bench.py [--waiting 20000] [--in-flight 1000] [--rounds 40]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from bench.host import python_speed_ms

from aigcq.config import PlatformConfig, Settings
from aigcq.domain import TaskState
from aigcq.embedded.redis import EmbeddedRedis
from aigcq.plumbing.redis_client import redis_client
from aigcq.runtime import Runtime
from aigcq.serve.live_tasks import LiveFilter, live_page
from aigcq.serve.server import ServeProcess

PAGE = 50


async def fill(rt: Runtime, waiting: int, in_flight: int) -> None:
    for i in range(waiting + in_flight):
        payload: dict[str, Any] = {"workflowId": "w"}
        await rt.store.submit(
            f"task-{i:06d}", aigc="proj", platform="comfyui", backend_id="b", payload=payload
        )
    await rt.store.claim("proj", "comfyui", "runninghub", cap=-1, n=in_flight, deadline_s=3600)


async def timed(rt: Runtime, wanted: LiveFilter, offset: int, rounds: int) -> dict[str, Any]:
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        page = await live_page(rt, wanted, offset, PAGE)
        seconds.append(time.perf_counter() - start)
    ms = sorted(s * 1000 for s in seconds)
    return {
        "median_ms": round(statistics.median(ms), 2),
        "p90_ms": round(ms[int(len(ms) * 0.9) - 1], 2),
        "rows": len(page["tasks"]),
        "total": page["total"],
    }


async def run(waiting: int, in_flight: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = EmbeddedRedis(root / "redis", persist=False)
        server.start()
        try:
            (root / "model.json").write_text('{"proj": {"comfyui": {"apikey": "k"}}}')
            redis = redis_client(server.url)
            settings = Settings(redis_url=server.url, token_secret="b" * 32, config_dir=root)
            rt = ServeProcess(settings, PlatformConfig.load(root), redis).rt
            await fill(rt, waiting, in_flight)
            last = max(0, waiting + in_flight - PAGE)
            figures = {
                "first_page": await timed(rt, LiveFilter(), 0, rounds),
                "last_page": await timed(rt, LiveFilter(), last, rounds),
                "in_flight_only": await timed(
                    rt, LiveFilter(state=TaskState.DISPATCHING), 0, rounds
                ),
            }
            await redis.aclose()
            return figures
        finally:
            server.stop()


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"waiting": 100, "in_flight": 10, "rounds": 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiting", type=int, default=20000)
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=40)
    args = smoke.parse_args(parser, SMOKE)
    before = python_speed_ms()
    figures = asyncio.run(run(args.waiting, args.in_flight, args.rounds))
    out = {"waiting": args.waiting, "in_flight": args.in_flight, **figures}
    out["host_python_ms"] = [before, python_speed_ms()]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
