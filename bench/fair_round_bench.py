"""One round of the fair policy's planning, in-process on a real Redis (issue 27). Prints JSON.

What ``AIGCQ_SCHEDULER=fair`` adds to a dispatch round, beside the claims a fifo round makes
too: the window read (``window.lua``: each queue's head, the tasks in flight, run means and
usage, one step), the planner's inputs (:func:`aigcq.scheduler.fair.inputs`), the decision
(:func:`aigcq.scheduler.policy.plan_round`) and the usage charge. Timed per round for
windows as the dispatch loop reads them (a third of the tasks with a start deadline, 160 in
flight, 8 free slots): without paid room (the free slots plus the bridge look-ahead), with
paid room (plus the room, the tasks in flight read), and the whole look-ahead window a
round with paid room reads once a sweep interval (in pages, as the round reads it).
``host_python_ms`` says how loaded the host was.

``eta_read``: the estimates' read of ``AIGCQ_ETA_WINDOW`` (1,000) tasks of each queue, as
one script (before) and in pages (:data:`aigcq.queue.store.WINDOW_PAGE` tasks per queue,
one script each, as :class:`~aigcq.scheduler.estimator.Estimator` reads them now): Redis's
own time for the whole read and for its longest single command (from ``SLOWLOG``: how long
every other client waited behind it), at ``--eta-waiting`` tasks in one queue.

    python bench/fair_round_bench.py [--rounds 300] [--projects 4] [--waiting 2000]
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

import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.host import python_speed_ms

from aigcq.config import Settings
from aigcq.domain import Ordering
from aigcq.embedded.redis import EmbeddedRedis
from aigcq.queue.store import WINDOW_PAGE, TaskStore
from aigcq.scheduler import fair
from aigcq.scheduler.dispatch import BUSY_MAX, read_window, window_size
from aigcq.scheduler.estimator import MAX_RUNNING
from aigcq.scheduler.policy import plan_round
from aigcq.scheduler.usage import Usage

PAYLOAD = {"workflowId": "1904136902449209346", "nodeInfoList": []}


async def fill(store: TaskStore, projects: int, waiting: int, in_flight: int) -> None:
    """``waiting`` tasks over ``projects`` queues (a third with a deadline, some users and
    credits), ``in_flight`` of them claimed for the bridges and running."""
    for i in range(waiting):
        ordering = Ordering(
            user=f"u{i % 7}", credit_s=float(i % 5), max_wait_s=600.0 if i % 3 == 0 else None
        )
        await store.submit(
            f"t{i}",
            aigc=f"p{i % projects}",
            platform="comfyui",
            backend_id="b1",
            payload=PAYLOAD,
            ordering=ordering,
        )
    for p in range(projects):
        claimed = await store.claim(
            f"p{p}", "comfyui", "bridge", cap=-1, n=in_flight // projects, deadline_s=600
        )
        for c in claimed:
            await store.mark_running(c.task_id, c.attempt, "", deadline_s=600, kind="callback")


#: free slots in each timed round, and each queue's paid room when it has some
FREE, ROOM = 8, 5


async def rounds(
    store: TaskStore,
    settings: Settings,
    usage: Usage,
    args: argparse.Namespace,
    *,
    paying: bool,
    whole: bool = False,
) -> dict[str, Any]:
    """Rounds as :meth:`aigcq.scheduler.dispatch.DispatchLoop._fair_round` makes them."""
    queues = [(f"p{p}", "comfyui") for p in range(args.projects)]
    free = FREE
    rooms = dict.fromkeys(queues, ROOM if paying else 0)
    size = window_size(settings, free, sum(rooms.values()), whole=whole)
    lengths = {q: int(await store.redis.llen(store.keys.wait(*q))) for q in queues}
    read, planned, charged = [], [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        busy_max = BUSY_MAX if paying else 0
        window = await read_window(store, lengths, size, "bridge", busy_max=busy_max, user_limit=0)
        t1 = time.perf_counter()
        now = time.time()
        given = fair.inputs(
            window, free=free, free_elsewhere=0, settings=settings, keys=store.keys, now=now
        )
        decision = plan_round(given.tasks, given.pool, given.shares, rooms, now)
        t2 = time.perf_counter()
        await usage.charge(decision.charged, decision.charged_users)
        t3 = time.perf_counter()
        read.append((t1 - t0) * 1000)
        planned.append((t2 - t1) * 1000)
        charged.append((t3 - t2) * 1000)
    return {
        "window_tasks": len(window.tasks),
        "busy_read": len(window.busy),
        "read_p50_ms": round(statistics.median(read), 3),
        "plan_p50_ms": round(statistics.median(planned), 3),
        "charge_p50_ms": round(statistics.median(charged), 3),
        "round_p50_ms": round(
            statistics.median(a + b + c for a, b, c in zip(read, planned, charged, strict=True)),
            3,
        ),
    }


async def redis_time(redis: aioredis.Redis, read: Any) -> tuple[float, float]:
    """Redis's time (ms) for the commands ``read()`` sends: in all, and the longest one."""
    await redis.config_set("slowlog-log-slower-than", 0)
    await redis.slowlog_reset()
    await read()
    entries = await redis.slowlog_get(10_000)
    await redis.config_set("slowlog-log-slower-than", 10_000)
    times = [e["duration"] / 1000 for e in entries if "slowlog" not in str(e["command"]).lower()]
    return round(sum(times), 3), round(max(times, default=0.0), 3)


async def eta_read(store: TaskStore, redis: aioredis.Redis, n: int, trials: int) -> dict[str, Any]:
    """The estimates' window read of one queue of ``n`` tasks: one script, then pages."""
    queue = ("eta", "comfyui")
    for i in range(n):
        await store.submit(
            f"e{i}", aigc=queue[0], platform=queue[1], backend_id="b1", payload=PAYLOAD,
            ordering=Ordering(user=f"u{i % 7}", max_wait_s=600.0 if i % 3 == 0 else None),
        )  # fmt: skip
    window = 1000

    read: dict[str, int] = {}

    async def one_script() -> None:
        got = await store.window([queue], window, "bridge", busy_max=MAX_RUNNING)
        read["one_script"] = len(got.tasks)

    async def pages() -> None:
        got = await store.window_in_pages(
            {queue: n}, window, "bridge", page=WINDOW_PAGE, busy_max=MAX_RUNNING
        )
        read["pages"] = len(got.tasks)

    out: dict[str, Any] = {"waiting": n, "page": WINDOW_PAGE, "tasks_read": read}
    for name, how in (("one_script", one_script), ("pages", pages)):
        runs = [await redis_time(redis, how) for _ in range(trials)]
        out[f"{name}_redis_ms"] = round(statistics.median(r[0] for r in runs), 3)
        out[f"{name}_longest_command_ms"] = round(statistics.median(r[1] for r in runs), 3)
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="aigcq-fair-round-"))
    server = EmbeddedRedis(tmp / "redis", persist=False)
    url = server.start()
    redis = aioredis.Redis.from_url(url, decode_responses=True)
    store = TaskStore(redis, "aigcq", retention_s=3600, outbox_retention_s=3600)
    settings = Settings()
    usage = Usage(redis, store.mux, store.keys, settings.share_half_life_s)
    try:
        await fill(store, args.projects, args.waiting, args.in_flight)
        report: dict[str, Any] = {"host_python_ms": [python_speed_ms()]}
        report["no_paid_room"] = await rounds(store, settings, usage, args, paying=False)
        report["paid_room"] = await rounds(store, settings, usage, args, paying=True)
        report["paid_room_whole_window"] = await rounds(
            store, settings, usage, args, paying=True, whole=True
        )
        report["eta_read"] = await eta_read(store, redis, args.eta_waiting, trials=20)
        report["host_python_ms"].append(python_speed_ms())
        return report
    finally:
        await store.aclose()
        await redis.aclose()
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--projects", type=int, default=4)
    parser.add_argument("--waiting", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=160)
    parser.add_argument("--eta-waiting", type=int, default=1000)
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=2))
