"""What the bridges of the other aigcq processes on the same Redis can run.

A bridge connects to one process, so each process knows only its own bridges' offers (node
classes and model files per instance, see :mod:`.capabilities`). A task none of them can
run was left to the other processes whenever any held a bridge, so a task that no bridge
of the cluster can run (a node class nobody has) waited for ever, never failing
``NoCapableInstance`` (seen against real ComfyUI behind two processes). So every process
writes what its bridges offer to ``{prefix}:internal:offers`` (field: a process id, value:
JSON ``{"at": ms, "bridges": n, "online": [[classes, models], ...] | null, "offline":
[...]}``; ``online`` null: a bridge here does not describe its instances, it may run
anything), at once when that changes and every ``refresh_s``, and reads the others' every
``refresh_s`` and at once when the count of another process's bridges changed.
:meth:`PeerOffers.reach` then says whether another process's bridge can run a task,
could once an offline instance is back, or none can.

A process holding bridges (:attr:`PeerCapacity.holding`, read every 0.1 s) whose entry is
missing, older than ``stale_s`` or written for another count of bridges (not read since a
bridge came or went, or an aigcq that does not write one) may run anything: a task only a
bridge that just connected there can run is never failed for want of its offers. An
entry of a process holding no bridge counts for nothing and a stale one is removed.

A bridge that leaves (its socket closed: most often a routine restart) keeps what it
offered for ``AIGCQ_BRIDGE_GRACE_S``, in the same hash (field ``left:{bridgeId}``, its
``at`` the end of the grace, with its ``slots``), written by the process it left
(:meth:`PeerOffers.left`) and removed by the one it registers with again
(:meth:`PeerOffers.back`), or at the end of the grace by any. A task only such a bridge can
run waits for it (``Reach.LEFT``): it neither fails ``NoCapableInstance`` nor goes to the
paid platform while the bridge may be back any second. Its slots stay in the free count of
the process it left (:meth:`PeerOffers.departed_here`, which that process adds to what it
writes to ``{prefix}:internal:free``), so that no process sees them gone before it sees
them kept: what waiting tasks wait for rather than overflow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
from redis.asyncio import Redis

from aigcq.bridges.lookahead import Reach
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import REDIS_OUTAGE, nudged
from aigcq.plumbing.text import text
from aigcq.wire.capabilities import Needs

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Offered:
    """What a process's bridges offer: on instances that are up (None: not known, a bridge
    that does not describe its instances), and on offline ones (withdrawn until back)."""

    online: tuple[Needs, ...] | None
    offline: tuple[Needs, ...] = ()
    bridges: int = 0  # how many bridges offer them


NOTHING = Offered(())


class Departed(NamedTuple):
    """A bridge that left: its slots, and the process it left."""

    slots: int
    by: str


#: the field prefix of a bridge that left, kept for its grace
LEFT = "left:"


def _pairs(offers: Iterable[Needs]) -> list[list[list[str]]]:
    return sorted([sorted(o.node_classes), sorted(o.models)] for o in set(offers))


def encode(offered: Offered, at_ms: int, **extra: str | int) -> str:
    """``extra``: a bridge that left's ``slots`` and the process it left (``by``)."""
    online = None if offered.online is None else _pairs(offered.online)
    offline = _pairs(offered.offline)
    body = {"at": at_ms, "bridges": offered.bridges, "online": online, "offline": offline}
    return orjson.dumps(body | extra).decode()


def decode(raw: Any) -> tuple[Offered, int, Departed] | None:
    """An entry as :func:`encode` wrote it, when, and (a bridge that left) its slots and
    the process it left; None for anything else."""
    try:
        body = orjson.loads(raw)
        online = body["online"]
        offered = Offered(
            None if online is None else tuple(_needs(p) for p in online),
            tuple(_needs(p) for p in body["offline"]),
            int(body["bridges"]),
        )
        return offered, int(body["at"]), Departed(int(body.get("slots", 0)), str(body.get("by")))
    except (orjson.JSONDecodeError, LookupError, TypeError, ValueError, AttributeError):
        return None


def _needs(pair: list[list[str]]) -> Needs:
    classes, models = pair
    return Needs(frozenset(map(str, classes)), frozenset(map(str, models)))


class PeerOffers:
    """Writes this process's offers and reads the others' (see the module docstring)."""

    def __init__(
        self,
        redis: Redis,
        key: str,
        process_id: str,
        mine: Callable[[], Offered],
        holding: Callable[[], dict[str, int]],
        *,
        refresh_s: float = 1.0,
        stale_s: float = 5.0,
    ) -> None:
        self.redis, self.key, self.process_id = redis, key, process_id
        self.mine, self.holding = mine, holding
        self.refresh_s, self.stale_ms = refresh_s, int(stale_s * 1000)
        self._theirs: dict[str, Offered] = {}  # process id -> its fresh offers
        #: bridge id -> what a bridge that left offered, and its slots, within its grace
        self._left: dict[str, tuple[Offered, Departed]] = {}
        self._lock = asyncio.Lock()  # a sync, or a bridge leaving or back
        #: (needs, the processes holding bridges) -> :meth:`reach`; cleared at each read
        self._reach: dict[tuple[Needs, frozenset[tuple[str, int]]], Reach] = {}
        self._nudged = asyncio.Event()

    def changed(self) -> None:
        """Our bridges or what they offer changed: write (and read) now."""
        self._nudged.set()

    async def run(self) -> None:
        what = "offers of other processes not read"
        try:
            await nudged(self.refresh_s, self._nudged, self.sync, log, what)
        finally:
            with contextlib.suppress(*REDIS_OUTAGE):
                await self.redis.hdel(self.key, self.process_id)

    async def left(self, bridge_id: str, offered: Offered, slots: int, grace_s: float) -> None:
        """The bridge left this process: what it ``offered`` and its ``slots`` are kept
        for ``grace_s`` (0: not kept)."""
        if grace_s <= 0:
            return
        until_ms = int((time.time() + grace_s) * 1000)
        departed = Departed(slots, self.process_id)
        entry = encode(offered, until_ms, **departed._asdict())
        async with self._lock:  # not undone by a sync that read the hash before
            await self.redis.hset(self.key, LEFT + bridge_id, entry)
            self._left[bridge_id] = (offered, departed)  # known here at once
            self._reach = {}
        log.info(
            "bridge %s: its offers are kept %g s for its return",
            bridge_id,
            grace_s,
            extra=ctx(bridge=bridge_id),
        )
        self.changed()

    async def back(self, bridge_id: str) -> None:
        """The bridge registered here: what it offers is live again, not kept (while
        Redis is away, the others keep it until their next read, at most its grace)."""
        async with self._lock:
            if self._left.pop(bridge_id, None) is not None:
                self._reach = {}
            removed = 0
            with contextlib.suppress(*REDIS_OUTAGE):
                removed = await self.redis.hdel(self.key, LEFT + bridge_id)
        if removed:
            self.changed()

    async def sync(self) -> None:
        """Write ours, read everyone else's and the bridges' that left (not at once with
        :meth:`left` or :meth:`back`: a read from before either would undo it here)."""
        async with self._lock:
            now_ms = int(time.time() * 1000)
            pipe = self.redis.pipeline(transaction=False)
            pipe.hset(self.key, self.process_id, encode(self.mine(), now_ms))
            pipe.hgetall(self.key)
            entries = (await pipe.execute())[1]
            theirs, left, stale = {}, {}, []
            for field, raw in entries.items():
                name = text(field)
                if name == self.process_id:
                    continue
                found = decode(raw)
                if name.startswith(LEFT):  # "at": the end of its grace
                    if found is None or found[1] <= now_ms:
                        stale.append(name)
                    else:
                        left[name.removeprefix(LEFT)] = (found[0], found[2])
                elif found is None or now_ms - found[1] > self.stale_ms:
                    stale.append(name)
                else:
                    theirs[name] = found[0]
            if stale:
                await self.redis.hdel(self.key, *stale)
            self._theirs, self._left = theirs, left
            self._reach = {}

    def departed_here(self) -> int:
        """The slots of the bridges that left this process within their grace (expected
        back, wherever they register)."""
        return sum(d.slots for _, d in self._left.values() if d.by == self.process_id)

    def reach(self, needs: Needs) -> Reach:
        """Whether a bridge of another process can run ``needs`` (``ELSEWHERE``), a
        bridge that left within its grace could (``LEFT``), could once an offline instance
        of it is back (``OFFLINE``), or none can (``NOWHERE``)."""
        holding = frozenset(self.holding().items())
        found = self._reach.get((needs, holding))
        if found is None:
            found = self._reach[needs, holding] = self._ask(needs, holding)
        return found

    def _ask(self, needs: Needs, holding: frozenset[tuple[str, int]]) -> Reach:
        offline = False
        for process_id, bridges in holding:
            offered = self._theirs.get(process_id)
            if offered is None or offered.online is None or offered.bridges != bridges:
                return Reach.ELSEWHERE  # not known (or not since a bridge came): not ruled out
            if any(o.covers(needs) for o in offered.online):
                return Reach.ELSEWHERE
            offline = offline or any(o.covers(needs) for o in offered.offline)
        if any(_covers(offered, needs) for offered, _ in self._left.values()):
            return Reach.LEFT
        return Reach.OFFLINE if offline else Reach.NOWHERE

    def unknown_classes(self, needs: Needs, here: Offered) -> frozenset[str]:
        """The node classes of ``needs`` that no bridge of the cluster offers: not
        ``here`` (this process's bridges), another process's, nor one that left within its
        grace, on an instance up or offline (none when one does not describe its own)."""
        everyone = [here, *self._theirs.values(), *(o for o, _ in self._left.values())]
        if any(o.online is None for o in everyone):
            return frozenset()
        offers = (n for o in everyone for n in (*(o.online or ()), *o.offline))
        return needs.node_classes - frozenset().union(*(n.node_classes for n in offers))


def _covers(offered: Offered, needs: Needs) -> bool:
    """Whether an instance of ``offered`` (up or offline) runs ``needs`` (not described:
    it may run anything)."""
    online = offered.online
    return online is None or any(o.covers(needs) for o in (*online, *offered.offline))
