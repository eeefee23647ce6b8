"""Internal capacity held by the other aigcq processes on the same Redis.

A bridge connects to one process, so each process sees only its own bridges' free slots.
Knowing nothing of the others', a process whose bridges are busy (or that has none, like
a second worker that a bridge did not happen to connect to) would overflow to a paid
platform tasks another process could run at once. So every process writes its free
slots and bridges to ``{prefix}:internal:free`` (field: a process id, value:
``"<free> <bridges> <ms>"``) and
reads the others' every ``interval_s`` (so a view is at most about twice that old);
routing lets tasks they can take wait for them. A process a bridge registers with writes
its entry at once and publishes it (a ``peer:`` event, :meth:`PeerCapacity.announce`), so
the new bridge's slots count everywhere before any later task is routed.
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

from redis.asyncio import Redis

from aigcq.plumbing.background import REDIS_OUTAGE, one_round

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
        """``channel``: where :meth:`announce` publishes (the process's events channel)."""
        self.redis, self.key, self.mine, self.channel = redis, key, mine, channel
        self.on_less = on_less  # capacity elsewhere shrank: held tasks may overflow now
        self.interval_s, self.stale_ms = interval_s, int(stale_s * 1000)
        self.process_id = uuid.uuid4().hex
        self.elsewhere = 0  # free slots on other processes' bridges
        self.bridges_elsewhere = 0  # bridges connected to other processes
        #: the others' entries, as last read or heard: process id -> (free, bridges, ms)
        self._entries: dict[str, tuple[int, int, int]] = {}
        self._reads = 0  # syncs done
        self._expected: list[int] = []  # per slot freed elsewhere: the sync it counts until

    async def run(self) -> None:
        what = "internal capacity of other processes not read"
        try:
            while True:
                with one_round(log, what):  # failed: keep the last view, try again
                    await self.sync()
                await asyncio.sleep(self.interval_s)
        finally:
            with contextlib.suppress(*REDIS_OUTAGE):  # left behind, the others drop it as stale
                await self.redis.hdel(self.key, self.process_id)

    async def sync(self) -> None:
        """Write our free slots and bridges, read everyone else's."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.key, self.process_id, self._value())
        pipe.hgetall(self.key)
        _, entries = await pipe.execute()
        heard, self._entries = self._entries, {}
        for process_id, value in entries.items():
            if process_id != self.process_id:
                self._merge(str(process_id), _parsed(str(value)))
                if process_id in heard:  # heard since it was read: keep the newer
                    self._merge(str(process_id), heard[process_id])
        before = self.free
        self._reads += 1
        self._expected = [until for until in self._expected if until > self._reads]
        stale = self._tally()
        if stale:
            await self.redis.hdel(self.key, *stale)
        if self.free < before:
            self.on_less()

    async def announce(self) -> None:
        """Write our entry now and publish it (a bridge registered here): the others count
        its slots when they hear it, before a task that reaches them after it is routed,
        not at their next read."""
        value = self._value()
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.key, self.process_id, value)
        pipe.publish(self.channel, f"{PEER_EVENT}:{self.process_id} {value}")
        await pipe.execute()

    def heard(self, announced: str) -> None:
        """Another process's :meth:`announce` (``"<process id> <free> <bridges> <ms>"``)."""
        process_id, _, value = announced.partition(" ")
        if process_id == self.process_id:
            return
        before = self.free
        self._merge(process_id, _parsed(value))
        self._tally()
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

    def _value(self) -> str:
        free, bridges = self.mine()
        return f"{free} {bridges} {int(time.time() * 1000)}"

    def _merge(self, process_id: str, entry: tuple[int, int, int]) -> None:
        known = self._entries.get(process_id)
        if known is None or entry[2] >= known[2]:
            self._entries[process_id] = entry

    def _tally(self) -> list[str]:
        """Totals from the entries; the stale ones (dropped from the view)."""
        now_ms = int(time.time() * 1000)
        stale = [p for p, (_, _, at) in self._entries.items() if now_ms - at > self.stale_ms]
        for process_id in stale:
            del self._entries[process_id]
        self.elsewhere = sum(free for free, _, _ in self._entries.values())
        self.bridges_elsewhere = sum(bridges for _, bridges, _ in self._entries.values())
        return stale


#: the event a process publishes its entry in (see :meth:`PeerCapacity.announce`)
PEER_EVENT = "peer"


def _parsed(value: str) -> tuple[int, int, int]:
    """An entry's (free, bridges, ms); one not ours (an older version's format) is stale."""
    try:
        free, bridges, at = map(int, value.split())
    except ValueError:
        return 0, 0, 0
    return free, bridges, at
