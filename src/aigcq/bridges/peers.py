"""Internal capacity held by the other aigcq processes on the same Redis.

A bridge connects to one process, so each process sees only its own bridges' free slots.
Knowing nothing of the others', a process whose bridges are busy (or that has none, like
a second worker that a bridge did not happen to connect to) would overflow to a paid
platform tasks another process could run at once. So every process writes its free
slots and bridges to ``{prefix}:internal:free`` (field: a process id, value:
``"<free> <bridges> <ms>"``) and
reads the others' every ``interval_s``, and at once when told its own count changed
(:meth:`PeerCapacity.changed`) or that another process's grew (a ``capacity`` event,
published by a process whose free slots grew): a slot freed on one process is known to
the others within a few milliseconds, so none of them pays for a task that slot could
run. Routing lets tasks they can take wait for them.
An entry not refreshed within ``stale_s`` (its process stopped) counts for nothing and
is removed.

A slot this process has just freed on another process's bridge (it heard of the task's
end and told that process, see :mod:`.endings`) counts as free elsewhere at once
(:meth:`PeerCapacity.expect`), until two reads of the others' entries have passed: that
process may give the slot to a waiting task (a retry that waited for it) before any read
here would show it free, and meanwhile this process must not pay for that task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis

from aigcq.plumbing.background import REDIS_OUTAGE, nudged

log = logging.getLogger(__name__)


class PeerCapacity:
    def __init__(
        self,
        redis: Redis,
        key: str,
        mine: Callable[[], tuple[int, int]],
        *,
        on_less: Callable[[], None],
        channel: str = "",
        interval_s: float = 0.1,
        stale_s: float = 2.0,
    ) -> None:
        self.redis, self.key, self.mine = redis, key, mine
        self.on_less = on_less  # capacity elsewhere shrank: held tasks may overflow now
        self.channel = channel  # where a ``capacity`` event tells the others ours grew
        self.interval_s, self.stale_ms = interval_s, int(stale_s * 1000)
        self.process_id = uuid.uuid4().hex
        self.elsewhere = 0  # free slots on other processes' bridges
        self.bridges_elsewhere = 0  # bridges connected to other processes
        #: the other processes holding bridges now, with how many (their offers:
        #: :mod:`.peer_offers`)
        self.holding: dict[str, int] = {}
        #: called when :attr:`holding` changed (read the others' offers again now)
        self.on_holding: Callable[[], None] = lambda: None
        self._written = -1  # our free slots as last written (none yet)
        self._nudged = asyncio.Event()
        self._reads = 0  # syncs done
        self._expected: list[int] = []  # per slot freed elsewhere: the sync it counts until

    def changed(self) -> None:
        """Our free slots changed, or another process's grew: write and read now."""
        self._nudged.set()

    async def run(self) -> None:
        what = "internal capacity of other processes not read"
        try:
            await nudged(self.interval_s, self._nudged, self.sync, log, what)
        finally:
            with contextlib.suppress(*REDIS_OUTAGE):  # left behind, the others drop it as stale
                await self.redis.hdel(self.key, self.process_id)

    async def write(self) -> None:
        """Write our free slots and bridges now (telling the others if they grew), not at
        the next sync: before this process makes dispatchable a task that a slot it has
        just freed may run, so that no other process plans that task while the slot
        still looks taken."""
        pipe = self.redis.pipeline(transaction=False)
        free = self._write(pipe, int(time.time() * 1000))
        await pipe.execute()
        self._written = free

    async def sync(self) -> None:
        """Write our free slots and bridges, read everyone else's."""
        now_ms = int(time.time() * 1000)
        pipe = self.redis.pipeline(transaction=False)
        free = self._write(pipe, now_ms)
        pipe.hgetall(self.key)
        entries = (await pipe.execute())[-1]
        self._written = free
        await self._apply(entries, now_ms, counted=True)

    def _write(self, pipe: Any, now_ms: int) -> int:
        """Our entry, and a ``capacity`` event if our free slots grew, into ``pipe``."""
        free, bridges = self.mine()
        pipe.hset(self.key, self.process_id, f"{free} {bridges} {now_ms}")
        if free > self._written and self.channel:
            pipe.publish(self.channel, "capacity")
        return free

    async def read(self) -> None:
        """Read everyone else's entries now, before paying for a task a slot of theirs
        may run: a sync's read may have left before their last write (the ``capacity``
        event that tells of it comes while it is out). Not a sync: the slots expected
        free elsewhere (:meth:`expect`) count as long as they did."""
        await self._apply(await self.redis.hgetall(self.key), int(time.time() * 1000))

    async def _apply(self, entries: dict[Any, Any], now_ms: int, *, counted: bool = False) -> None:
        total, connected, stale, holding = 0, 0, [], {}
        for process_id, value in entries.items():
            if process_id == self.process_id:
                continue
            try:
                their_free, their_bridges, at = map(int, str(value).split())
            except ValueError:  # not ours (an older version's format): drop it
                their_free, their_bridges, at = 0, 0, 0
            if now_ms - at > self.stale_ms:
                stale.append(process_id)
            else:
                total += their_free
                connected += their_bridges
                if their_bridges:
                    holding[str(process_id)] = their_bridges
        if stale:
            await self.redis.hdel(self.key, *stale)
        self.bridges_elsewhere = connected
        if holding != self.holding:
            self.holding = holding
            self.on_holding()
        before = self.free
        if counted:
            self._reads += 1
            self._expected = [until for until in self._expected if until > self._reads]
        self.elsewhere = total
        if self.free < before:
            self.on_less()

    @property
    def free(self) -> int:
        """Free slots elsewhere: those the others wrote, and those just freed there."""
        return self.elsewhere + len(self._expected)

    def expect(self) -> None:
        """A slot on another process's bridge was freed from here (see the module's
        docstring): free elsewhere until two syncs from now."""
        self._expected.append(self._reads + 2)
