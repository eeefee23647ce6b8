"""autoTune: runtime ``max_concurrency`` / ``queue_limit`` per model from recent history.

Over the last ``W`` seconds (``windowSeconds``, default 3600), for each model with ``n`` ≥ 1
successful attempts finished in the window:

* ``d`` = P90 of ``finished_at − started_at`` (seconds), ``λ = n / W`` (tasks per second);
* ``max_concurrency = clamp(ceil(1.5 · λ · d) + 1, 1, cap_max_concurrency)`` — Little's law
  (``λ · d`` slots are busy on average) with 50 % + 1 headroom, so a saturated model grows
  and an idle one shrinks;
* ``queue_limit = clamp(floor(max_concurrency · timeout_seconds / d), max_concurrency,
  cap_queue_limit)`` — no more tasks than can be served before the last one would time out.

Results go to ``asynch:runtime:*:{model}`` with a TTL (default 2 h); the configured caps in
``asynch_models`` are never changed. Models without finished attempts are left alone.
"""

from __future__ import annotations

import math
from typing import Any

import redis.asyncio as aioredis

from aigcq.asynch.db import Pool
from aigcq.asynch.runtime import runtime_max_concurrency_key, runtime_queue_limit_key

DEFAULT_WINDOW_SECONDS = 3600
HEADROOM = 1.5

_HISTORY = """
SELECT m.model_name, m.max_concurrency, m.queue_limit, m.timeout_seconds,
       count(t.task_id) AS samples,
       percentile_cont(0.9) WITHIN GROUP (
           ORDER BY extract(epoch FROM t.finished_at - t.started_at)) AS p90
FROM asynch_models m
JOIN asynch_task t ON t.model_name = m.model_name AND t.state IN (2, 4)
    AND t.started_at IS NOT NULL AND t.finished_at >= now() - make_interval(secs => %s)
GROUP BY m.model_name, m.max_concurrency, m.queue_limit, m.timeout_seconds
"""


def tune(
    *, samples: int, p90: float, window: float, cap_mc: int, cap_ql: int, timeout: int
) -> tuple[int, int]:
    """The formula above: ``(max_concurrency, queue_limit)``."""
    throughput = samples / window
    mc = min(cap_mc, max(1, math.ceil(HEADROOM * throughput * p90) + 1))
    per_slot = timeout / p90 if p90 > 0 else math.inf
    ql = cap_ql if math.isinf(per_slot) else math.floor(mc * per_slot)
    return mc, min(cap_ql, max(mc, ql))


async def auto_tune(
    pool: Pool, redis: aioredis.Redis, window_seconds: int | None, ttl: int
) -> list[dict[str, Any]]:
    """Compute and store the runtime limits; one entry per tuned model."""
    window = window_seconds if window_seconds and window_seconds > 0 else DEFAULT_WINDOW_SECONDS
    async with pool.connection() as conn:
        rows = await (await conn.execute(_HISTORY, (window,))).fetchall()
    results = []
    for row in rows:
        p90 = float(row["p90"] or 0.0)
        mc, ql = tune(
            samples=row["samples"],
            p90=p90,
            window=window,
            cap_mc=row["max_concurrency"],
            cap_ql=row["queue_limit"],
            timeout=row["timeout_seconds"],
        )
        name = row["model_name"]
        async with redis.pipeline(transaction=True) as pipe:
            pipe.set(runtime_max_concurrency_key(name), mc, ex=ttl)
            pipe.set(runtime_queue_limit_key(name), ql, ex=ttl)
            await pipe.execute()
        results.append(
            {
                "modelName": name,
                "samples": row["samples"],
                "p90Seconds": round(p90, 3),
                "throughputPerSecond": round(row["samples"] / window, 6),
                "maxConcurrency": mc,
                "queueLimit": ql,
            }
        )
    return results
