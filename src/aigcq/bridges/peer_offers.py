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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

from aigcq.bridges.capabilities import Needs
from aigcq.bridges.lookahead import Reach
from aigcq.plumbing.background import REDIS_OUTAGE, nudged

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Offered:
    """What a process's bridges offer: on instances that are up (None: not known, a bridge
    that does not describe its instances), and on offline ones (withdrawn until back)."""

    online: tuple[Needs, ...] | None
    offline: tuple[Needs, ...] = ()
    bridges: int = 0  # how many bridges offer them


NOTHING = Offered(())


def _pairs(offers: Iterable[Needs]) -> list[list[list[str]]]:
    return sorted([sorted(o.node_classes), sorted(o.models)] for o in set(offers))


def encode(offered: Offered, at_ms: int) -> str:
    online = None if offered.online is None else _pairs(offered.online)
    offline = _pairs(offered.offline)
    body = {"at": at_ms, "bridges": offered.bridges, "online": online, "offline": offline}
    return orjson.dumps(body).decode()


def decode(raw: Any) -> tuple[Offered, int] | None:
    """An entry as :func:`encode` wrote it, and when; None for anything else."""
    try:
        body = orjson.loads(raw)
        online = body["online"]
        offered = Offered(
            None if online is None else tuple(_needs(p) for p in online),
            tuple(_needs(p) for p in body["offline"]),
            int(body["bridges"]),
        )
        return offered, int(body["at"])
    except (orjson.JSONDecodeError, LookupError, TypeError, ValueError):
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

    async def sync(self) -> None:
        """Write ours, read everyone else's."""
        now_ms = int(time.time() * 1000)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.key, self.process_id, encode(self.mine(), now_ms))
        pipe.hgetall(self.key)
        entries = (await pipe.execute())[1]
        theirs, stale = {}, []
        for process_id, raw in entries.items():
            pid = process_id.decode() if isinstance(process_id, bytes) else str(process_id)
            if pid == self.process_id:
                continue
            found = decode(raw)
            if found is None or now_ms - found[1] > self.stale_ms:
                stale.append(pid)
            else:
                theirs[pid] = found[0]
        if stale:
            await self.redis.hdel(self.key, *stale)
        self._theirs = theirs
        self._reach = {}

    def reach(self, needs: Needs) -> Reach:
        """Whether a bridge of another process can run ``needs`` (``ELSEWHERE``), could
        once an offline instance of it is back (``OFFLINE``), or none can (``NOWHERE``)."""
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
        return Reach.OFFLINE if offline else Reach.NOWHERE
