"""The dashboard's last hour: queue depth, oldest wait, tasks in flight and overflow spend
every ``every_s`` seconds, and submit→result latency (p50 / p99) of recent tasks; and the
last ten minutes of tasks finished internally and externally, summed per ``bucket_s``.

Per process and in memory, like the split chart: a restarted process starts a new hour.
Spend is what this process's overflow cost since its dashboard started (the Prometheus
counters it reads never go back to zero while the process lives).
The latency is read from the most recently finished tasks still retained in Redis (any
process's), so it is the fleet's.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

from aigcq.domain import TaskState
from aigcq.queue.store import TaskStore
from aigcq.serve.admin_panels import overflow_spend

TREND_EVERY_S = 10.0
TREND_POINTS = 360  # an hour at 10 s
LATENCY_SAMPLE = 200  # finished tasks the percentiles are taken over
SPLIT_BUCKET_S = 10.0  # finished tasks are summed over this long (a count a second is noise)
SPLIT_BUCKETS = 60  # ten minutes at 10 s


def percentile(sorted_values: list[float], share: float) -> float | None:
    """Nearest-rank percentile of ``sorted_values`` (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(share * len(sorted_values)))
    return round(sorted_values[rank - 1], 3)


class Trends:
    def __init__(self, every_s: float | None = None) -> None:
        self.every_s = TREND_EVERY_S if every_s is None else every_s
        self.points: deque[dict[str, Any]] = deque(maxlen=TREND_POINTS)
        self.latency: dict[str, Any] = {"p50": None, "p99": None, "tasks": 0}
        self._last = float("-inf")
        self._spend_base = float(overflow_spend()["totalCost"])

    async def sample(
        self, store: TaskStore, queues: list[dict[str, Any]], overflow: dict[str, Any]
    ) -> None:
        """Add a point when ``every_s`` has passed since the last one."""
        now = time.time()
        if now - self._last < self.every_s:
            return
        self._last = now
        self.points.append(
            {
                "t": now,
                "waiting": sum(q["waiting"] for q in queues),
                "oldestWaitS": max((q["oldestWaitS"] for q in queues), default=0.0),
                "inFlight": sum(sum(q["inFlight"].values()) for q in queues),
                "spend": round(overflow.get("totalCost", 0.0) - self._spend_base, 4),
            }
        )
        finished = await store.reads.recent(LATENCY_SAMPLE)
        seconds = sorted(
            t.updated_at - t.created_at for t in finished if t.state is TaskState.SUCCESS
        )
        self.latency = {
            "p50": percentile(seconds, 0.5),
            "p99": percentile(seconds, 0.99),
            "tasks": len(seconds),
        }

    def view(self) -> dict[str, Any]:
        return {"history": list(self.points), "latency": dict(self.latency)}


class Split:
    """Tasks finished internally and externally: the totals, and the sums per ``bucket_s``
    of the last ``buckets`` (each point keyed by its bucket's start; the last one fills as
    its time passes)."""

    def __init__(self, bucket_s: float | None = None, buckets: int = SPLIT_BUCKETS) -> None:
        self.bucket_s = SPLIT_BUCKET_S if bucket_s is None else bucket_s
        self.points: deque[dict[str, Any]] = deque(maxlen=buckets)
        self.totals = {"internal": 0, "external": 0}

    def add(self, now: float, internal: int, external: int) -> None:
        start = now - now % self.bucket_s
        if not self.points or self.points[-1]["t"] != start:
            self.points.append({"t": start, "internal": 0, "external": 0})
        for name, n in (("internal", internal), ("external", external)):
            self.points[-1][name] += n
            self.totals[name] += n

    def view(self) -> dict[str, Any]:
        return {
            "bucketS": self.bucket_s,
            "history": [dict(p) for p in self.points],
            "totals": dict(self.totals),
        }
