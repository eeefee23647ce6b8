"""One dispatch round at depth, in-process on a real Redis (issue 37). Prints JSON.

For each depth (100, 10,000 and 100,000 by default) a queue holds that many tasks in a
held key ahead of one ready task, and a round reads, plans and claims as
:meth:`aigcq.scheduler.dispatch.DispatchLoop._plan_round` does (``window.lua`` over the
ready keys and the earliest start deadlines, :func:`aigcq.scheduler.fair.inputs`,
:func:`aigcq.scheduler.policy.plan_round`, the claim by id). Two kinds of held key:

* ``paused``: the tasks of a paused workflow (out of the ready keys);
* ``user_limit``: one end user's tasks while it is at ``AIGCQ_USER_MAX_RUNNING``;
* ``users``: that many end users who ran on our GPUs, a task each (a round reads the
  users fair shares put first: the one who never ran, not every user with work).

Per round: Redis's own time for its commands (``SLOWLOG`` at 0 µs: what every other client
waited) and this process's CPU (``time.process_time``), medians over ``--rounds``; the
ready task claimed must be the one behind the held key. Flat across depths is the target.
``memory_per_waiting_task_b``: Redis ``used_memory`` per waiting task, from the fill.

    python bench/round_bench.py [--rounds 50] [--depths 100,10000,100000]
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
from bench.host import python_speed_ms

from aigcq.config import Settings
from aigcq.domain import Ordering
from aigcq.embedded.redis import EmbeddedRedis
from aigcq.plumbing.redis_client import redis_client
from aigcq.queue.store import TaskStore
from aigcq.scheduler import fair
from aigcq.scheduler.dispatch import key_head
from aigcq.scheduler.policy import RESCUE_MAX, plan_round

QUEUE = ("proj", "comfyui")
FREE = 2  # free slots in each round
FILL_BATCH = 500


def payload(workflow: str) -> dict[str, Any]:
    return {"workflowId": workflow, "nodeInfoList": [{"nodeId": "6", "fieldName": "text",
                                                      "fieldValue": "a cat on a mat"}]}  # fmt: skip


async def fill(store: TaskStore, prefix: str, n: int, workflow: str, user: str) -> None:
    """``n`` waiting tasks of one key, submitted in concurrent batches (one pipeline each)."""
    for start in range(0, n, FILL_BATCH):
        await asyncio.gather(
            *(
                store.submit(
                    f"{prefix}{i}",
                    aigc=QUEUE[0],
                    platform=QUEUE[1],
                    backend_id="b1",
                    payload=payload(workflow),
                    ordering=Ordering(user=user),
                )
                for i in range(start, min(start + FILL_BATCH, n))
            )
        )


async def fill_users(store: TaskStore, n: int) -> None:
    """``n`` end users who ran (a usage record each), with a waiting task each."""
    now = time.time()
    for start in range(0, n, FILL_BATCH):
        batch = range(start, min(start + FILL_BATCH, n))
        pipe = store.redis.pipeline(transaction=False)
        for i in batch:
            pipe.set(store.keys.usage(QUEUE[0], f"ran{i}"), f"{10 + i} {now} 3600")
        await pipe.execute()
        await asyncio.gather(
            *(
                store.submit(f"u{i}", aigc=QUEUE[0], platform=QUEUE[1], backend_id="b1",
                             payload=payload("free"), ordering=Ordering(user=f"ran{i}"))
                for i in batch
            )
        )  # fmt: skip


async def hold(store: TaskStore, kind: str) -> int:
    """Hold the deep key: pause its workflow, or put its user at the limit (1)."""
    if kind == "users":
        return 0
    if kind == "paused":
        await store.pause_workflow("held", orjson.dumps({"since": 0}))
        return 0
    await store.claim(*QUEUE, "bridge", cap=-1, n=1, deadline_s=600, ids=["d0"], user_limit=1)
    return 1


async def one_round(store: TaskStore, settings: Settings, limit: int) -> list[str]:
    """Read, plan and claim for the bridges: the ids claimed."""
    window = await store.reads.window(
        [QUEUE], key_head(settings, FREE, 0), "bridge", dated=RESCUE_MAX, busy_max=0,
        user_limit=limit, users_max=FREE + 1,
    )  # fmt: skip
    now = time.time()
    given = fair.inputs(window, free=FREE, free_elsewhere=0, settings=settings,
                        keys=store.keys, now=now)  # fmt: skip
    decision = plan_round(given.tasks, given.pool, given.shares, {}, now, fair.tuning(settings))
    ids = decision.internal.get(QUEUE, [])
    claimed = await store.claim(*QUEUE, "bridge", cap=-1, n=len(ids), deadline_s=600, ids=ids,
                                user_limit=limit)  # fmt: skip
    return [c.task_id for c in claimed]


async def slowlog_ms(redis: aioredis.Redis) -> float:
    entries = await redis.slowlog_get(10_000)
    return sum(e["duration"] for e in entries if "slowlog" not in str(e["command"]).lower()) / 1000


async def at_depth(redis: aioredis.Redis, depth: int, kind: str, rounds: int) -> dict[str, Any]:
    store = TaskStore(redis, f"b{depth}{kind}", retention_s=3600, outbox_retention_s=3600)
    settings = Settings()
    before = int((await redis.info("memory"))["used_memory"])
    if kind == "users":
        await fill_users(store, depth)
    else:
        await fill(store, "d", depth, "held", "heavy")
    per_task = (int((await redis.info("memory"))["used_memory"]) - before) / depth
    limit = await hold(store, kind)
    redis_ms, cpu_ms, wrong = [], [], 0
    for r in range(rounds):
        await fill(store, f"ready{r}-", 1, "free", f"light{r}")  # a user below its limit
        await redis.config_set("slowlog-log-slower-than", 0)
        await redis.slowlog_reset()
        cpu = time.process_time()
        got = await one_round(store, settings, limit)
        cpu_ms.append((time.process_time() - cpu) * 1000)
        redis_ms.append(await slowlog_ms(redis))
        wrong += f"ready{r}-0" not in got[:1]  # first: the users kind fills the other place
    await redis.config_set("slowlog-log-slower-than", 10_000)
    await redis.flushdb()
    return {
        "redis_ms_per_round": round(statistics.median(redis_ms), 3),
        "cpu_ms_per_round": round(statistics.median(cpu_ms), 3),
        "rounds_not_claiming_the_ready_task": wrong,
        "memory_per_waiting_task_b": round(per_task),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="aigcq-round-"))
    server = EmbeddedRedis(tmp / "redis", persist=False)
    redis = redis_client(server.start())
    try:
        report: dict[str, Any] = {"host_python_ms": [python_speed_ms()]}
        for kind in ("paused", "user_limit", "users"):
            report[kind] = {
                str(depth): await at_depth(redis, depth, kind, args.rounds) for depth in args.depths
            }
        report["host_python_ms"].append(python_speed_ms())
        return report
    finally:
        await redis.aclose()
        server.stop()


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"rounds": 3, "depths": [50]}

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument(
        "--depths", type=lambda s: [int(d) for d in s.split(",")], default=[100, 10_000, 100_000]
    )
    print(json.dumps(asyncio.run(main(smoke.parse_args(parser, SMOKE))), indent=2))
