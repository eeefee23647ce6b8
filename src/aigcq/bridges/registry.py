"""Bridges connected to this process, and their shared record in Redis.

Each process assigns only to its own connections (claims are atomic, so that is safe
across processes). The Redis hash ``{prefix}:bridge:{bridgeId}`` lets other processes and
the dashboard see every bridge; ``{prefix}:bridge:{bridgeId}:tasks`` (taskId -> attempt)
remembers the acknowledged tasks so a re-REGISTER anywhere can find the ones it lost,
and ``{prefix}:bridgeof:{taskId}`` names the bridge running an acknowledged task, so the
process that receives its TASK_END (over HTTP, possibly not the one holding the bridge's
socket) can count it. The hash's ``failures`` field is the bridge's count of consecutive
failed TASK_ENDs, shared by every process (HINCRBY on a failure, 0 on a success); the
process holding the connection applies quarantine from it (at once for TASK_ENDs it
receives, at the next save, i.e. HEARTBEAT, for those another process received).

Picking a bridge is O(log n): bridges with a free slot are bucketed by their sort key
(load, -free), the keys kept in a heap with lazy deletion. A :class:`BridgeConn` in the
registry re-files itself whenever a field its key depends on is assigned.
"""

from __future__ import annotations

import asyncio
import heapq
import random
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping, ValuesView
from dataclasses import dataclass, field

from redis.commands.core import AsyncScript

from aigcq.plumbing.text import text
from aigcq.queue.store import TaskStore

Send = Callable[[str], Awaitable[None]]
Key = tuple[float, int]  # (load, -free): the smallest is picked

#: BridgeConn fields that ``free()`` and ``load()`` depend on.
_INDEXED = frozenset({"available", "instance_count", "online", "quarantined_at", "drained"})

# KEYS: bridgeof:{taskId}. ARGV: prefix, taskId, ok (1/0), fallback bridgeId.
# Returns {bridgeId, failures}, or nil when no bridge is known for the task.
_COUNT_END = """
local bridge = redis.call('GET', KEYS[1])
if not bridge then bridge = ARGV[4] end
if bridge == '' then return nil end
redis.call('DEL', KEYS[1])
local key = ARGV[1] .. ':bridge:' .. bridge
redis.call('HDEL', key .. ':tasks', ARGV[2])
if redis.call('EXISTS', key) == 0 then return nil end
if ARGV[3] == '1' then
  redis.call('HSET', key, 'failures', 0)
  return {bridge, 0}
end
return {bridge, redis.call('HINCRBY', key, 'failures', 1)}
"""


@dataclass(slots=True)
class Assignment:
    """A TASK_ASSIGN sent and not yet acknowledged."""

    attempt: int
    aigc: str
    platform: str
    backend_id: str = ""
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class BridgeConn:
    """One live bridge connection. ``available`` counts a slot as taken at TASK_ASSIGN."""

    #: the registry holding this connection, told when a field in ``_INDEXED`` changes
    #: (first, so it exists before ``__init__`` assigns the others)
    owner: BridgeRegistry | None = field(default=None, init=False, repr=False, compare=False)
    bridge_id: str
    send: Send
    instance_count: int = 0
    available: int = 0
    online: bool = True
    last_seen: float = field(default_factory=time.monotonic)  # last REGISTER/HEARTBEAT
    last_pong: float = 0.0
    pending: dict[str, Assignment] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)  # acknowledged, awaiting TASK_END
    ended_early: set[str] = field(default_factory=set)  # TASK_END came before TASK_ACK
    failures: int = 0  # consecutive failed TASK_ENDs
    quarantined_at: float | None = None  # out of rotation since (monotonic)
    drained: bool = False  # by an operator: no new tasks, running ones finish

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name in _INDEXED and self.owner is not None:
            self.owner.refile(self)

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


class _Bucket:
    """Bridge ids with one sort key: O(1) add, remove and random choice."""

    __slots__ = ("ids", "pos")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.pos: dict[str, int] = {}

    def add(self, bridge_id: str) -> None:
        self.pos[bridge_id] = len(self.ids)
        self.ids.append(bridge_id)

    def remove(self, bridge_id: str) -> None:
        i = self.pos.pop(bridge_id)
        last = self.ids.pop()
        if last != bridge_id:
            self.ids[i] = last
            self.pos[last] = i


class _Bridges(MutableMapping[str, BridgeConn]):
    """``bridgeId -> BridgeConn``; adding or removing one (re)files it in the index."""

    def __init__(self, registry: BridgeRegistry) -> None:
        self._registry = registry
        self._d: dict[str, BridgeConn] = {}

    def __getitem__(self, bridge_id: str) -> BridgeConn:
        return self._d[bridge_id]

    def __setitem__(self, bridge_id: str, conn: BridgeConn) -> None:
        if bridge_id != conn.bridge_id:
            raise ValueError(f"{conn.bridge_id!r} filed as {bridge_id!r}")
        old = self._d.get(bridge_id)
        if old is not None and old is not conn:
            old.owner = None
        self._d[bridge_id] = conn
        conn.owner = self._registry
        self._registry.refile(conn)

    def __delitem__(self, bridge_id: str) -> None:
        conn = self._d.pop(bridge_id)
        conn.owner = None
        self._registry.unfile(bridge_id)

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, bridge_id: object) -> bool:
        return bridge_id in self._d

    def values(self) -> ValuesView[BridgeConn]:
        return self._d.values()


class BridgeRegistry:
    """In-memory map of this process's bridges, mirrored to Redis."""

    def __init__(self, store: TaskStore, prefix: str, ttl_s: int) -> None:
        """Per-task writes go through ``store``'s hot-path connection."""
        self.store = store
        self.prefix = prefix
        self.ttl_s = ttl_s
        bridges = _Bridges(self)
        self.bridges: MutableMapping[str, BridgeConn] = bridges
        self._conns = bridges._d  # the same dict, read without the mapping's overhead
        #: workflowId -> the bridge last given it (its models are likely loaded there)
        self.last_bridge: dict[str, str] = {}
        self.drained: set[str] = set()  # kept across reconnects
        # The pick index: bridges with a free slot by sort key; a min-heap of the keys
        # (a key whose bucket emptied stays until it reaches the top: lazy deletion).
        self._key_of: dict[str, Key] = {}
        self._buckets: dict[Key, _Bucket] = {}
        self._heap: list[Key] = []
        self._in_heap: set[Key] = set()
        self._free_of: dict[str, int] = {}
        self._free_total = 0
        self._count_end: AsyncScript | None = None

    def key(self, bridge_id: str) -> str:
        return f"{self.prefix}:bridge:{bridge_id}"

    def owner_key(self, task_id: str) -> str:
        return f"{self.prefix}:bridgeof:{task_id}"

    # ---- the pick index -------------------------------------------------------------------

    def refile(self, conn: BridgeConn) -> None:
        """Re-index ``conn`` after a change to its free slots, load or state."""
        bridge_id = conn.bridge_id
        if self._conns.get(bridge_id) is not conn:
            return
        free = conn.free()
        self._free_total += free - self._free_of.get(bridge_id, 0)
        self._free_of[bridge_id] = free
        new: Key | None = (conn.load(), -free) if free > 0 else None
        old = self._key_of.get(bridge_id)
        if new == old:
            return
        if old is not None:
            self._unbucket(bridge_id, old)
        if new is not None:
            self._key_of[bridge_id] = new
            bucket = self._buckets.get(new)
            if bucket is None:
                bucket = self._buckets[new] = _Bucket()
                if new not in self._in_heap:
                    self._in_heap.add(new)
                    heapq.heappush(self._heap, new)
            bucket.add(bridge_id)

    def unfile(self, bridge_id: str) -> None:
        """Forget ``bridge_id`` (no longer in :attr:`bridges`)."""
        self._free_total -= self._free_of.pop(bridge_id, 0)
        old = self._key_of.get(bridge_id)
        if old is not None:
            self._unbucket(bridge_id, old)

    def _unbucket(self, bridge_id: str, key: Key) -> None:
        del self._key_of[bridge_id]
        bucket = self._buckets[key]
        bucket.remove(bridge_id)
        if not bucket.ids:
            del self._buckets[key]

    def _least_loaded(self) -> _Bucket | None:
        heap = self._heap
        while heap:
            bucket = self._buckets.get(heap[0])
            if bucket is not None:
                return bucket
            self._in_heap.discard(heapq.heappop(heap))
        return None

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
        """``sum(b.free() for b in bridges)``, kept up to date (O(1))."""
        return self._free_total

    def pick(self, workflow_id: str = "") -> BridgeConn | None:
        """The least-loaded live bridge with a free slot (ties: the one with more free
        slots). Among equally placed ones: the bridge that last ran ``workflow_id`` (seed
        000 §9.2.3, same bridge first), else a random one, so ties do not always land on
        the same bridge. O(log n) (amortized), see :meth:`refile`."""
        bucket = self._least_loaded()
        if bucket is None:
            return None
        last = self.last_bridge.get(workflow_id) if workflow_id else None
        bridge_id = last if last is not None and last in bucket.pos else random.choice(bucket.ids)
        if workflow_id:
            self.last_bridge[workflow_id] = bridge_id
        return self._conns[bridge_id]

    async def save(self, conn: BridgeConn, *, failures: int | None = None) -> int:
        """Publish the bridge's capacity and last-seen time (and set its shared count of
        consecutive failures to ``failures``, if given); return that count."""
        key = self.key(conn.bridge_id)
        record = {
            "bridgeId": conn.bridge_id,
            "instanceCount": conn.instance_count,
            "availableInstanceCount": conn.free(),
            "online": int(conn.online),
            "inRotation": int(conn.quarantined_at is None),
            "drained": int(conn.drained),
            "lastSeen": time.time(),
        }
        if failures is not None:
            record["failures"] = failures
        replies = await self.store.mux.commands(
            ["HSET", key, *(x for kv in record.items() for x in kv)],
            ["EXPIRE", key, self.ttl_s],
            ["HGET", key, "failures"],
        )
        return int(replies[-1] or 0)

    async def count_end(self, task_id: str, ok: bool, fallback: str = "") -> tuple[str, int] | None:
        """Count a TASK_END against the bridge that ran ``task_id`` (``fallback`` if none is
        recorded): a success resets the bridge's shared failure count, a failure adds one.
        Return (bridgeId, the new count), or ``None`` when the bridge is unknown."""
        if self._count_end is None:
            self._count_end = self.store.redis.register_script(_COUNT_END)
        args: list[str | int] = [self.prefix, task_id, int(ok), fallback]
        out = await self.store.mux.script(self._count_end, [self.owner_key(task_id)], args)
        if not out:
            return None
        bridge_id, failures = out
        return text(bridge_id), int(failures)

    async def remember(self, bridge_id: str, task_id: str, attempt: int, ttl_s: int) -> None:
        """Record an acknowledged task as held by ``bridge_id``."""
        key = self.tasks_key(bridge_id)
        await self.store.mux.commands(
            ["HSET", key, task_id, attempt],
            ["EXPIRE", key, ttl_s],
            ["SET", self.owner_key(task_id), bridge_id, "EX", ttl_s],
        )

    async def take_held(self, bridge_id: str) -> dict[str, int]:
        """The acknowledged tasks recorded for ``bridge_id``, forgetting them."""
        key = self.tasks_key(bridge_id)
        pipe = self.store.redis.pipeline(transaction=True)
        pipe.hgetall(key)
        pipe.delete(key)
        raw, _ = await pipe.execute()
        return {str(k): int(v) for k, v in raw.items()}
