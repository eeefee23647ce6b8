"""Bridges connected to this process, and their shared record in Redis.

Each process assigns only to its own connections (claims are atomic, so that is safe
across processes). The Redis hash ``{prefix}:bridge:{bridgeId}`` lets other processes and
the dashboard see every bridge; ``{prefix}:bridge:{bridgeId}:tasks`` (taskId -> attempt)
remembers the acknowledged tasks so a re-REGISTER anywhere can find the ones it lost.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from redis.asyncio import Redis

Send = Callable[[str], Awaitable[None]]


@dataclass(slots=True)
class Pending:
    """A TASK_ASSIGN sent and not yet acknowledged."""

    attempt: int
    aigc: str
    platform: str
    backend_id: str = ""
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class BridgeConn:
    """One live bridge connection. ``available`` counts a slot as taken at TASK_ASSIGN."""

    bridge_id: str
    send: Send
    instance_count: int = 0
    available: int = 0
    online: bool = True
    last_seen: float = field(default_factory=time.monotonic)  # last REGISTER/HEARTBEAT
    last_pong: float = 0.0
    pending: dict[str, Pending] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)  # acknowledged, awaiting TASK_END
    failures: int = 0  # consecutive failed TASK_ENDs
    quarantined_at: float | None = None  # out of rotation since (monotonic)
    drained: bool = False  # by an operator: no new tasks, running ones finish

    def free(self) -> int:
        usable = self.online and self.quarantined_at is None and not self.drained
        return max(0, self.available) if usable else 0

    def load(self) -> float:
        """Share of instances in use (0 = idle); least-loaded bridges are picked first."""
        if self.instance_count <= 0:
            return 1.0
        return 1.0 - self.free() / self.instance_count

    def reconcile(self, instance_count: int, reported_available: int) -> None:
        """Trust the bridge's count, minus assignments it has not acknowledged yet."""
        self.instance_count = instance_count
        self.available = reported_available - len(self.pending)
        self.last_seen = time.monotonic()


class BridgeRegistry:
    """In-memory map of this process's bridges, mirrored to Redis."""

    def __init__(self, redis: Redis, prefix: str, ttl_s: int) -> None:
        self.redis = redis
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.bridges: dict[str, BridgeConn] = {}
        #: workflowId -> the bridge last given it (its models are likely loaded there)
        self.last_bridge: dict[str, str] = {}
        self.drained: set[str] = set()  # kept across reconnects

    def key(self, bridge_id: str) -> str:
        return f"{self.prefix}:bridge:{bridge_id}"

    def tasks_key(self, bridge_id: str) -> str:
        return f"{self.prefix}:bridge:{bridge_id}:tasks"

    def set_drained(self, bridge_id: str, drained: bool) -> BridgeConn | None:
        """Drain (or undrain) ``bridge_id``; its connection here, if any."""
        if drained:
            self.drained.add(bridge_id)
        else:
            self.drained.discard(bridge_id)
        conn = self.bridges.get(bridge_id)
        if conn is not None:
            conn.drained = drained
        return conn

    def live(self) -> list[BridgeConn]:
        return [b for b in self.bridges.values() if b.online]

    def free_slots(self) -> int:
        return sum(b.free() for b in self.bridges.values())

    def pick(self, workflow_id: str = "") -> BridgeConn | None:
        """The least-loaded live bridge with a free slot. Among equally loaded ones: the
        bridge that last ran ``workflow_id`` (seed 000 §9.2.3, same bridge first), else a
        random one, so ties do not always land on the same bridge."""
        candidates = [b for b in self.bridges.values() if b.free() > 0]
        if not candidates:
            return None
        best = min((b.load(), -b.free()) for b in candidates)
        tied = [b for b in candidates if (b.load(), -b.free()) == best]
        last = self.last_bridge.get(workflow_id) if workflow_id else None
        conn = next((b for b in tied if b.bridge_id == last), None) or random.choice(tied)
        if workflow_id:
            self.last_bridge[workflow_id] = conn.bridge_id
        return conn

    async def save(self, conn: BridgeConn) -> None:
        """Publish the bridge's capacity and last-seen time."""
        key = self.key(conn.bridge_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(
            key,
            mapping={
                "bridgeId": conn.bridge_id,
                "instanceCount": conn.instance_count,
                "availableInstanceCount": conn.free(),
                "online": int(conn.online),
                "inRotation": int(conn.quarantined_at is None),
                "drained": int(conn.drained),
                "lastSeen": time.time(),
            },
        )
        pipe.expire(key, self.ttl_s)
        await pipe.execute()

    async def remember(self, bridge_id: str, task_id: str, attempt: int, ttl_s: int) -> None:
        """Record an acknowledged task as held by ``bridge_id``."""
        key = self.tasks_key(bridge_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, task_id, attempt)
        pipe.expire(key, ttl_s)
        await pipe.execute()

    async def take_held(self, bridge_id: str) -> dict[str, int]:
        """The acknowledged tasks recorded for ``bridge_id``, forgetting them."""
        key = self.tasks_key(bridge_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hgetall(key)
        pipe.delete(key)
        raw, _ = await pipe.execute()
        return {str(k): int(v) for k, v in raw.items()}
