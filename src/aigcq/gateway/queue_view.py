"""One row per queue, as ``GET /api/queues`` (client token) and the admin snapshot show it:
waiting, in flight per target (the bridges included), capacity per target, oldest wait."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aigcq.runtime import Runtime
from aigcq.scheduler.targets import InternalTarget


@dataclass(frozen=True, slots=True)
class InternalCapacity:
    """The internal target as the queue view sees it: its name, the platforms it serves and
    its free slots now, on bridges in rotation of every process (a slot stopping a
    cancelled prompt included: free within about a second)."""

    name: str
    serves: tuple[str, ...]
    free: int


def internal_capacity(hub: InternalTarget | None) -> InternalCapacity | None:
    """The bridge hub's capacity now; None when this process has no hub."""
    if hub is None:
        return None
    return InternalCapacity(hub.name, hub.serves, hub.free_slots() + hub.free_elsewhere())


async def queue_rows(rt: Runtime, internal: InternalCapacity | None) -> list[dict[str, Any]]:
    """``capacity`` of an external target is its configured concurrency; of the internal
    one, what runs there plus its free slots. ``oldestWaitS`` is 0 when nothing waits."""
    keys, now = rt.store.keys, time.time()
    rows: list[dict[str, Any]] = []
    for aigc, platform in rt.config.queues():
        ext = rt.platforms.adapter_for(platform)
        inside = internal if internal and platform in internal.serves else None
        targets = [inside.name] if inside else []
        targets += [ext.name] if ext else []
        pipe = rt.redis.pipeline(transaction=False)
        pipe.zcard(keys.wait(aigc, platform))
        pipe.zrange(keys.wait(aigc, platform), 0, 0)
        for target in targets:
            pipe.zcard(keys.running(aigc, target))
        waiting, head, *counts = await pipe.execute()
        created = await rt.redis.hget(keys.task(str(head[0])), "created") if head else None
        inflight = dict(zip(targets, map(int, counts), strict=True))
        account = rt.config.account(aigc, platform)
        capacity = {ext.name: account.concurrency if account else 0} if ext else {}
        if inside:
            capacity = {inside.name: inflight[inside.name] + inside.free, **capacity}
        rows.append(
            {
                "AIGC": aigc,
                "platform": platform,
                "waiting": int(waiting),
                "inFlight": inflight,
                "capacity": capacity,
                "oldestWaitS": round(now - float(created), 1) if created else 0.0,
            }
        )
    return rows
