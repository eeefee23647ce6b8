"""Bridges connected to this process, and their shared record in Redis.

Each process assigns only to its own connections (claims are atomic, so that is safe
across processes). The Redis hash ``{prefix}:bridge:{bridgeId}`` lets other processes and
the dashboard see every bridge, and is what any process knows of a bridge that registers
with it (which process holds it, how it left, since when it is out of rotation: see
:mod:`.known`); it is kept :data:`~.known.KNOWN_FOR_S` after the bridge's last word, and a
process that no longer holds the bridge never writes that it left.
``{prefix}:bridge:{bridgeId}:tasks`` (taskId -> attempt) remembers the acknowledged tasks
so a re-REGISTER anywhere can find the ones it lost, and ``{prefix}:bridgesof:{taskId}``
(bridgeId -> attempt) the bridges running an attempt of the task, so the process that
receives its TASK_END (over HTTP, possibly not the one holding a bridge's socket) can
count it and tell each bridge's process. The record's ``failures`` field is the bridge's
count of consecutive failed TASK_ENDs, shared by every process (HINCRBY on a failure, 0 on
a success); the process holding the connection applies quarantine from it (at once for
TASK_ENDs it receives or hears of, see :mod:`.endings`, and at each save).

Picking a bridge is O(log n): bridges with a free slot are bucketed by their sort key
(load, -free), the keys kept in a heap with lazy deletion. A :class:`BridgeConn` in the
registry re-files itself on every change through its methods (its slots are a
:class:`~aigcq.bridges.slots.SlotLedger`), and the registry indexes which bridge holds
which task.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import (
    Callable,
    Collection,
    Iterable,
    Iterator,
    MutableMapping,
    ValuesView,
)
from dataclasses import dataclass
from typing import Any

import orjson
from redis.commands.core import AsyncScript

from aigcq.bridges.conn import BridgeConn
from aigcq.bridges.known import KNOWN_FOR_S, Standing
from aigcq.bridges.peer_offers import Offered
from aigcq.bridges.placing import Slot
from aigcq.bridges.slots import Assignment
from aigcq.plumbing.text import text
from aigcq.queue.keys import Keys
from aigcq.queue.store import TaskStore
from aigcq.wire.capabilities import Needs

Key = tuple[float, int]  # (load, -free): the smallest is picked

__all__ = ["Assignment", "BridgeConn", "BridgeRegistry", "Counted", "record_instances"]


def record_instances(raw: object) -> list[dict[str, Any]]:
    """The ``instances`` field of a bridge's shared record (what :meth:`BridgeRegistry.save`
    writes): each instance as its bridge reported it; ``[]`` when absent or unreadable."""
    try:
        value = orjson.loads(text(raw) or "[]")
    except orjson.JSONDecodeError:
        return []
    return [i for i in value if isinstance(i, dict)] if isinstance(value, list) else []


# A task's end. KEYS: bridgesof:{taskId}. ARGV: prefix, taskId, ok (1/0, '': no count),
# fallback bridgeId, attempt ('': not known). Every bridge recorded as holding the task is
# no longer; the one that ran ``attempt`` (not known: the latest; none recorded: the
# fallback) is counted. Returns {that bridge ('': none), its failure count (-1: it has no
# record), then each other bridge and its attempt}.
_COUNT_END = """
local held = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
local ran, latest, others = '', -1, {}
for i = 1, #held, 2 do
  redis.call('HDEL', ARGV[1] .. ':bridge:' .. held[i] .. ':tasks', ARGV[2])
  local attempt = tonumber(held[i + 1]) or 0
  if (ARGV[5] ~= '' and held[i + 1] == ARGV[5]) or (ARGV[5] == '' and attempt > latest) then
    ran, latest = held[i], attempt
  end
end
for i = 1, #held, 2 do
  if held[i] ~= ran then
    others[#others + 1] = held[i]
    others[#others + 1] = held[i + 1]
  end
end
if ran == '' then ran = ARGV[4] end
local failures = -1
local key = ARGV[1] .. ':bridge:' .. ran
if ran ~= '' and redis.call('EXISTS', key) == 1 then
  redis.call('HDEL', key .. ':tasks', ARGV[2])
  if ARGV[3] == '1' then
    redis.call('HSET', key, 'failures', 0)
    failures = 0
  elseif ARGV[3] == '0' then
    failures = redis.call('HINCRBY', key, 'failures', 1)
  else
    failures = tonumber(redis.call('HGET', key, 'failures') or '0')
  end
end
return {ran, failures, unpack(others)}
"""

# KEYS: a bridge's record. ARGV: this process, '1' when the write says the bridge left
# (then made only while no other process holds it), the record's TTL, field/value pairs.
# Returns the shared failure count, or -1 when not written.
_SAVE = """
if ARGV[2] == '1' then
  local holder = redis.call('HGET', KEYS[1], 'process')
  if holder and holder ~= '' and holder ~= ARGV[1] then return -1 end
end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[1], ARGV[3])
return tonumber(redis.call('HGET', KEYS[1], 'failures') or '0')
"""


@dataclass(frozen=True, slots=True)
class Counted:
    """A task's end as :meth:`BridgeRegistry.count_end` recorded it."""

    #: the bridge that ran the attempt that ended ('': none known)
    ran: str
    #: its shared count of consecutive failures (None: it has no record)
    failures: int | None
    #: the other bridges that were holding an attempt of the task -> that attempt
    others: dict[str, int]


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
            self._registry.unfile(old)
        self._d[bridge_id] = conn
        conn.owner = self._registry
        self._registry.offers_changed()
        self._registry.refile(conn, added=[*conn.pending, *conn.running])

    def __delitem__(self, bridge_id: str) -> None:
        conn = self._d.pop(bridge_id)
        conn.owner = None
        self._registry.offers_changed()
        self._registry.unfile(conn)

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
        """Per-task writes go through ``store``'s hot-path connection; ``ttl_s``: how long a
        bridge's record outlives its last save (at least :data:`~.known.KNOWN_FOR_S`)."""
        self.store = store
        self.prefix = prefix
        self.keys = Keys(prefix)
        self.ttl_s = max(ttl_s, KNOWN_FOR_S)
        #: this process, as a record names the process holding its bridge (set by the hub)
        self.process_id = ""
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
        #: taskId -> the bridges here holding it (two, briefly, when an attempt was
        #: superseded on one and runs on the other)
        self._holders: dict[str, list[BridgeConn]] = {}
        self._count_end: AsyncScript | None = None
        self._save: AsyncScript | None = None
        #: (needs, offline) -> whether a bridge here can run them (with ``offline``: could,
        #: on an instance that is offline); cleared when the bridges or what they offer
        #: change, so a task nobody can run costs O(1), not a scan of them all
        self._can_run: dict[tuple[Needs, bool], bool] = {}
        #: whether a bridge here describes what its instances offer (None: not known)
        self._describing: bool | None = None
        #: called when the bridges here or what they offer change (the hub tells the others)
        self.on_offers: Callable[[], None] = lambda: None

    # ---- the pick index -------------------------------------------------------------------

    def holders(self, task_id: str) -> list[BridgeConn]:
        """The bridges connected here that hold ``task_id`` (O(1))."""
        return list(self._holders.get(task_id, ()))

    def refile(self, conn: BridgeConn, added: Iterable[str] = (), gone: Iterable[str] = ()) -> None:
        """Re-index ``conn`` after a change to its free slots, load or state; ``added`` and
        ``gone``: the task ids it took on or let go."""
        bridge_id = conn.bridge_id
        if self._conns.get(bridge_id) is not conn:
            return
        for task_id in added:
            holders = self._holders.setdefault(task_id, [])
            if conn not in holders:
                holders.append(conn)
        for task_id in gone:
            self._unhold(task_id, conn)
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

    def unfile(self, conn: BridgeConn) -> None:
        """Forget ``conn`` (no longer in :attr:`bridges`)."""
        bridge_id = conn.bridge_id
        for task_id in [*conn.pending, *conn.running]:
            self._unhold(task_id, conn)
        self._free_total -= self._free_of.pop(bridge_id, 0)
        old = self._key_of.get(bridge_id)
        if old is not None:
            self._unbucket(bridge_id, old)

    def _unhold(self, task_id: str, conn: BridgeConn) -> None:
        holders = self._holders.get(task_id)
        if holders is not None and conn in holders:
            holders.remove(conn)
            if not holders:
                del self._holders[task_id]

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

    def set_drained(self, bridge_id: str, drained: bool) -> BridgeConn | None:
        """Drain (or undrain) ``bridge_id``; its connection here, if any."""
        if drained:
            self.drained.add(bridge_id)
        else:
            self.drained.discard(bridge_id)
        conn = self.bridges.get(bridge_id)
        if conn is not None:
            conn.set_state(drained=drained)
        return conn

    def live(self) -> list[BridgeConn]:
        return [b for b in self.bridges.values() if b.online]

    def free_slots(self) -> int:
        """``sum(b.free() for b in bridges)``, kept up to date (O(1))."""
        return self._free_total

    def pick(
        self,
        workflow_id: str = "",
        needs: Needs | None = None,
        exclude: Collection[BridgeConn] = (),
    ) -> BridgeConn | None:
        """The least-loaded live bridge with a free slot (ties: the one with more free
        slots) that can run ``needs`` (see :mod:`.capabilities`). Among equally placed ones:
        the bridge that last ran ``workflow_id`` (seed 000 §9.2.3, same bridge first, its
        models likely loaded), else a random one, so ties do not always land on the same
        bridge. O(log n) (amortized, see :meth:`refile`) when that bridge can run it, else
        the buckets are scanned in order until one holds a bridge that can."""
        bucket = self._least_loaded()
        if bucket is None:
            return None
        last = self.last_bridge.get(workflow_id) if workflow_id else None
        bridge_id = last if last is not None and last in bucket.pos else random.choice(bucket.ids)
        conn: BridgeConn | None = self._conns[bridge_id]
        if conn in exclude or (needs is not None and conn is not None and not conn.can_run(needs)):
            capable = needs is None or self.anyone_can_run(needs)
            conn = self._capable(needs, last, exclude) if capable else None
        if workflow_id and conn is not None:
            self.last_bridge[workflow_id] = conn.bridge_id
        return conn

    def _capable(
        self, needs: Needs | None, last: str | None, exclude: Collection[BridgeConn] = ()
    ) -> BridgeConn | None:
        """The pick among bridges that can run ``needs`` and are not in ``exclude``: buckets
        in key order (there are few keys), the first with such a bridge."""
        for key in sorted(self._buckets):
            ids = [
                b
                for b in self._buckets[key].ids
                if self._conns[b] not in exclude
                and (needs is None or self._conns[b].can_run(needs))
            ]
            if ids:
                return self._conns[last if last in ids else random.choice(ids)]
        return None

    def anyone_can_run(self, needs: Needs) -> bool:
        """Whether a bridge connected here (busy or not) can run ``needs`` on an instance
        that is not offline (O(1) but for the first ask after a change to the bridges or
        their offers)."""
        return self._ask(needs, offline=False)

    def anyone_could_run(self, needs: Needs) -> bool:
        """Whether a bridge connected here could run ``needs`` on an instance that is
        offline (its offer withdrawn until it is back)."""
        return self._ask(needs, offline=True)

    def _ask(self, needs: Needs, *, offline: bool) -> bool:
        known = self._can_run.get((needs, offline))
        if known is None:
            if len(self._can_run) >= 1024:
                self._can_run.clear()
            conns = self._conns.values()
            known = any(c.could_run(needs) if offline else c.can_run(needs) for c in conns)
            self._can_run[needs, offline] = known
        return known

    def describing(self) -> bool:
        """Whether a bridge here describes what its instances offer: then tasks are placed
        per instance (:meth:`free_spots`), else per bridge (:meth:`pick`)."""
        if self._describing is None:
            self._describing = any(c.offers is not None for c in self._conns.values())
        return self._describing

    def free_spots(self, per_kind: int) -> list[Slot]:
        """The slots a task can be counted on now (see :meth:`BridgeConn.free_instances`),
        least-loaded bridges first (ties: each time in another order): the first
        ``per_kind`` of each kind (what an instance offers), all that ``per_kind`` tasks
        could need."""
        spots: list[Slot] = []
        taken: dict[Needs | None, int] = {}
        for key in sorted(self._buckets):
            ids = self._buckets[key].ids
            start = random.randrange(len(ids))
            for bridge_id in itertools.chain(ids[start:], ids[:start]):
                conn = self._conns[bridge_id]
                for offer, instance_ids in conn.free_instances().items():
                    had = taken.get(offer, 0)
                    if had < per_kind:
                        more = instance_ids[: per_kind - had]
                        taken[offer] = had + len(more)
                        spots.extend(Slot(conn, i, offer) for i in more)
        return spots

    def offers_changed(self) -> None:
        """A bridge came, went, or reported other node classes or model files, or an
        instance went offline or came back."""
        self._can_run.clear()
        self._describing = None
        self.on_offers()

    def offered(self) -> Offered:
        """What the bridges here offer, for the other processes (:mod:`.peer_offers`)."""
        online: list[Needs] = []
        offline: list[Needs] = []
        live = self.live()  # the bridges this process counts in {prefix}:internal:free
        for conn in live:
            offline += conn.withdrawn
            if conn.offers is None:
                return Offered(None, tuple(offline), len(live))
            online += conn.offers
        return Offered(tuple(online), tuple(offline), len(live))

    async def save(self, conn: BridgeConn, *, failures: int | None = None) -> int:
        """Publish the bridge's capacity, last-seen time and standing, held by this process
        (and set its shared count of consecutive failures to ``failures``, if given);
        return that count."""
        record = self._record(conn)
        record.update(process=self.process_id, left="", leftAt="")
        if failures is not None:
            record["failures"] = failures
        return await self._write(conn.bridge_id, record, leaving=False)

    async def leave(self, conn: BridgeConn, how: str) -> bool:
        """Record that the bridge left this process (``how``: :data:`~.known.CLOSED` or
        :data:`~.known.SILENT`), unless another process holds it now (it moved there
        first); whether it was written."""
        record = self._record(conn)
        record.update(online=0, availableInstanceCount=0, left=how, leftAt=time.time())
        return await self._write(conn.bridge_id, record, leaving=True) >= 0

    async def standing(self, bridge_id: str) -> Standing:
        """What the cluster last recorded of ``bridge_id`` (see :mod:`.known`)."""
        record = await self.store.redis.hgetall(self.keys.bridge(bridge_id))
        return Standing.of({text(k): text(v) for k, v in record.items()})

    def _record(self, conn: BridgeConn) -> dict[str, str | int | float]:
        out = conn.quarantined_at
        return {
            "bridgeId": conn.bridge_id,
            "instanceCount": conn.instance_count,
            "availableInstanceCount": conn.free(),
            "online": int(conn.online),
            "inRotation": int(out is None),
            "quarantinedAt": "" if out is None else _epoch(out),
            "drained": int(conn.drained),
            "instances": orjson.dumps(conn.instance_states).decode(),
            "lastSeen": time.time(),
        }

    async def _write(
        self, bridge_id: str, record: dict[str, str | int | float], *, leaving: bool
    ) -> int:
        if self._save is None:
            self._save = self.store.redis.register_script(_SAVE)
        fields = [x for kv in record.items() for x in kv]
        args = [self.process_id, int(leaving), self.ttl_s, *fields]
        return int(await self.store.mux.script(self._save, [self.keys.bridge(bridge_id)], args))

    async def count_end(
        self, task_id: str, ok: bool | None, attempt: int | None, fallback: str = ""
    ) -> Counted:
        """A task's end: the bridges recorded as holding it no longer do. The one that ran
        ``attempt`` (``fallback`` if none is recorded) is counted: a success resets its
        shared failure count, a failure adds one, ``None`` leaves it."""
        if self._count_end is None:
            self._count_end = self.store.redis.register_script(_COUNT_END)
        ended = "" if attempt is None else attempt
        args = [self.prefix, task_id, "" if ok is None else int(ok), fallback, ended]
        out = await self.store.mux.script(self._count_end, [self.keys.bridges_of(task_id)], args)
        ran, failures, rest = text(out[0]), int(out[1]), out[2:]
        others = {text(b): int(a) for b, a in zip(rest[::2], rest[1::2], strict=True)}
        return Counted(ran, failures if failures >= 0 else None, others)

    async def held_elsewhere(self, task_id: str, attempt: int) -> bool:
        """Whether ``attempt`` of ``task_id`` was acknowledged by a bridge that another
        process holds now (its record online, naming that process)."""
        held = await self.store.redis.hgetall(self.keys.bridges_of(task_id))
        bridge = next((text(b) for b, a in held.items() if int(a) == attempt), None)
        if bridge is None or bridge in self._conns:
            return False
        online, process = await self.store.redis.hmget(
            self.keys.bridge(bridge), ["online", "process"]
        )
        return text(online) == "1" and text(process) not in ("", self.process_id)

    async def keep(self, bridge_id: str, tasks: dict[str, int], ttl_s: int) -> None:
        """Record acknowledged ``tasks`` (taskId -> attempt) as held by ``bridge_id``, in
        one round trip however many they are (a re-REGISTER's; one acknowledgement is
        recorded by :meth:`TaskStore.mark_running` itself)."""
        if not tasks:
            return
        key = self.keys.bridge_tasks(bridge_id)
        commands: list[list[str | int]] = [
            ["HSET", key, *(x for kv in tasks.items() for x in kv)],
            ["EXPIRE", key, ttl_s],
        ]
        for task_id, attempt in tasks.items():
            of = self.keys.bridges_of(task_id)
            commands += [["HSET", of, bridge_id, attempt], ["EXPIRE", of, ttl_s]]
        await self.store.mux.commands(*commands)

    async def held(self, bridge_id: str) -> dict[str, int]:
        """The acknowledged tasks recorded for ``bridge_id``. Read, not taken: each is
        forgotten (:meth:`forget`) only once its end is settled, so a restart or a lost
        reply halfway through a reconcile leaves the rest for the next one."""
        raw = await self.store.redis.hgetall(self.keys.bridge_tasks(bridge_id))
        return {text(k): int(v) for k, v in raw.items()}

    async def forget(self, bridge_id: str, task_id: str) -> None:
        """``task_id`` is no longer recorded as held by ``bridge_id``."""
        await self.store.mux.commands(
            ["HDEL", self.keys.bridge_tasks(bridge_id), task_id],
            ["HDEL", self.keys.bridges_of(task_id), bridge_id],
        )


def _epoch(monotonic: float) -> float:
    """A ``time.monotonic()`` instant in epoch seconds (to the millisecond), as records
    say when, whichever process reads them."""
    return round(time.time() - (time.monotonic() - monotonic), 3)
