"""A task's end on the bridges: free its slot, stop what is no longer wanted, count.

Whichever way a task ends (its TASK_END applied, or refused as gone; a cancel), the
bridge holding it gets its slot back at once (a failure that may take the bridge out of
rotation: once counted). A bridge still running a cancelled, timed-out or superseded
attempt is told to stop (TASK_CANCEL), its slot free when it says so. A machine's failure
counts against the bridge, a success resets the count (see :mod:`.rotation`); the task's
own failure does not.

Any process may hear of the end (a TASK_END reaches whichever process its webhook URL
names; a cancel, whichever the client is connected to). The bridges holding an attempt of
the task are recorded in Redis (:meth:`.BridgeRegistry.count_end`), and each one connected
to another process hears of the end there at once, by a ``bridge-end`` event
(``bridgeId``, ``taskId``, the ``attempt`` that ended, how it ended as ``end``, and for
the bridge that ran it ``ran`` and its shared ``failures``): that process applies the count,
frees the slot or stops the attempt exactly as for an end it heard itself, and makes a
machine failure's retry dispatchable, which waited out of its queue for that slot (see
:meth:`aigcq.scheduler.lifecycle.Lifecycle.released`). The process holding the bridge
does the same for an end it heard itself: the slot freed, its free slots written for the
others, then the retry made dispatchable. A slot elsewhere that an end heard here frees,
or stops (free within about a second), counts as free elsewhere here at once, and on every
other process from the ``bridge-end`` event that names it (its ``from``: the sender).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from aigcq.bridges.registry import BridgeConn, BridgeRegistry, Counted
from aigcq.bridges.rotation import Rotation
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import REDIS_OUTAGE, Spawner
from aigcq.plumbing.events import bridge_end_event
from aigcq.runtime import Runtime
from aigcq.scheduler.ends import STOPPED, TaskEnd
from aigcq.wire.bridge import TaskCancelData, TaskCancelMessage, encode

log = logging.getLogger(__name__)

_COUNTED = {TaskEnd.SUCCEEDED: True, TaskEnd.FAILED: False}
#: ends whose retry may wait for the slot (a machine's failure; with ``retry_failures``,
#: any failure: see :attr:`aigcq.scheduler.lifecycle.Lifecycle.slot_freed_later`)
_RETRIED = frozenset({TaskEnd.FAILED, TaskEnd.REJECTED})
#: longest :meth:`TaskEnds.told` waits for an end to be told to the other processes
TELL_WAIT_S = 2.0


async def _nothing() -> None:
    return None


class TaskEnds:
    def __init__(
        self,
        rt: Runtime,
        name: str,
        registry: BridgeRegistry,
        rotation: Rotation,
        wake: Callable[[], None],
        *,
        freed_elsewhere: Callable[[], None] = lambda: None,
        bridges_elsewhere: Callable[[], bool] = lambda: False,
        released: Callable[[str], Awaitable[bool]],
        published: Callable[[], Awaitable[None]] = _nothing,
        me: str = "",
    ) -> None:
        self.rt = rt
        self.name = name
        self.registry = registry
        self.rotation = rotation
        self.wake = wake
        #: a slot on another process's bridge is free now (that process is told)
        self.freed_elsewhere = freed_elsewhere
        #: whether other processes hold bridges now
        self.bridges_elsewhere = bridges_elsewhere
        #: the slot a machine failure's retry waited for is free: it may be dispatched
        self.released = released
        #: writes this process's free slots for the others now (:meth:`.PeerCapacity.write`)
        self.published = published
        #: this process's id, named in the ``bridge-end`` events it sends
        self.me = me
        self._spawn = Spawner()
        #: ends heard here of tasks a bridge of another process holds, being told there
        self._telling: dict[str, asyncio.Task[None]] = {}

    def task_ended(self, task_id: str, target: str, end: TaskEnd, attempt: int | None) -> None:
        """A task ended (its result applied or refused as gone, a cancel): its slot is free
        at once on whichever bridge here holds it, and a bridge still running a cancelled
        or superseded attempt is told to stop (TASK_CANCEL). A machine's failure counts
        against the bridge and a success resets the count, shared in Redis (see
        :class:`.Rotation`); only the failure that may take the bridge out of rotation
        frees its slot after the count, so that bridge is out before it is reused."""
        holders = self.registry.holders(task_id)
        if target != self.name and not holders:
            return
        ran = next((b for b in holders if b.slots.attempt_of(task_id) == attempt), None)
        # A failure that may take its bridge out frees the slot only after the count (the
        # bridge is out first); any other frees it now, before the task it requeued is
        # dispatched again: a slot still taken then made the retry overflow to a paid
        # platform while its own GPU was about to be free.
        last_straw = end is TaskEnd.FAILED and ran is not None and self.rotation.last_straw(ran)
        for conn in holders:
            if not (last_straw and conn is ran):
                self.end_on(conn, task_id, end, attempt)
        if ran is not None and end in _RETRIED and not last_straw:
            self._spawn(self._release(task_id))  # a failure's retry waits for the slot
        if end is TaskEnd.GONE:
            return  # a bridge elsewhere frees it when it stops listing the task
        # held by a bridge of another process: its slot is free there, or stopping (free
        # within about a second), once that process hears of the end; a cancel's or a
        # timeout's is counted free elsewhere from now, not after the count's round trip (a
        # task submitted with a cancel, planned meanwhile, was paid for while that slot was
        # about to be free); any other end once the count names the bridge that ran it (a
        # TASK_END after a report freed the slot, or for a bridge gone, frees nothing)
        elsewhere = not holders
        now = elsewhere and end in STOPPED and self.bridges_elsewhere()
        if now:
            self.freed_elsewhere()
        counting = self._spawn(
            self._count(task_id, end, ran, attempt, free_after=last_straw, expected=now)
        )
        if elsewhere:  # told once the holding process has its bridge-end events
            telling = counting
        elif end in STOPPED:  # stopping here: told once our free slots are written
            telling = self._spawn(self._publish(task_id))
        else:
            return
        self._telling[task_id] = telling
        telling.add_done_callback(partial(self._told, task_id))

    async def _publish(self, task_id: str) -> None:
        try:
            await self.published()
        except REDIS_OUTAGE as exc:  # the others read it at their next sync
            log.info("task %s: free slots not written: %r", task_id, exc, extra=ctx(task=task_id))

    def _told(self, task_id: str, counting: asyncio.Task[None]) -> None:
        if self._telling.get(task_id) is counting:
            del self._telling[task_id]

    async def told(self, task_id: str) -> None:
        """Once every process knows that the slot ``task_id`` held, which ended here, is
        free or stopping (at most ``TELL_WAIT_S``): the process holding its bridge has its
        ``bridge-end`` events, or, held here, our free slots are written. What this
        process does next (a cancel's answer, then its client's next submit and the
        ``wake`` it publishes) reaches them after that, so none of them plans that slot
        as busy and pays for the next task."""
        counting = self._telling.get(task_id)
        if counting is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(counting), TELL_WAIT_S)

    async def _count(
        self,
        task_id: str,
        end: TaskEnd,
        ran: BridgeConn | None,
        attempt: int | None,
        *,
        free_after: bool,
        expected: bool,
    ) -> None:
        """Count the end and tell the processes holding the task's other bridges; with
        ``free_after``, free the slot of the bridge that ran it after the count, however
        the count went (Redis away while saving it); ``expected``: its slot elsewhere is
        counted free already."""
        try:
            counted = await self.rotation.count_end(task_id, _COUNTED.get(end), ran, attempt)
            if counted is not None:
                await self._tell_elsewhere(task_id, end, attempt, counted, expected=expected)
        finally:
            if ran is not None and free_after:
                self.end_on(ran, task_id, end, attempt)
                await self._release(task_id)

    async def _tell_elsewhere(
        self, task_id: str, end: TaskEnd, attempt: int | None, counted: Counted, *, expected: bool
    ) -> None:
        """A ``bridge-end`` event for each bridge that held the task and is not connected
        here. The slot of the one that ran the attempt counts as free elsewhere from now
        (unless ``expected``: it does already), before that process's next capacity
        report: free there, or stopping, which that process counts as free elsewhere too
        (:meth:`.BridgeHub.stopping_here`)."""
        here = self.registry.bridges
        events = [
            {"bridgeId": b, "taskId": task_id, "attempt": attempt, "end": end.value}
            for b in counted.others
            if b not in here
        ]
        if counted.ran and counted.ran not in here:
            ran = {"bridgeId": counted.ran, "taskId": task_id, "attempt": attempt}
            ran |= {"end": end.value, "ran": True, "failures": counted.failures, "from": self.me}
            events.append(ran)
            if not expected:
                self.freed_elsewhere()
        if events:
            channel = self.rt.store.keys.events
            await self.rt.store.mux.commands(
                *(["PUBLISH", channel, bridge_end_event(e)] for e in events)
            )

    def end_on(self, conn: BridgeConn, task_id: str, end: TaskEnd, attempt: int | None) -> None:
        held = conn.slots.attempt_of(task_id)
        if held is None or (end is TaskEnd.GONE and attempt not in (None, held)):
            return  # a newer attempt runs there: its slot stays taken
        stop = end in STOPPED or (end is not TaskEnd.GONE and held != attempt)
        if stop:
            self._spawn(self.cancel_on(conn, task_id, held))
        # told to stop it: a bridge that reports its capacity frees the slot when its
        # instance is free (ComfyUI takes about a second to stop a prompt); a seed bridge's
        # is free now
        conn.end(task_id, stopping=stop)
        self.wake()

    async def cancel_on(self, conn: BridgeConn, task_id: str, attempt: int) -> None:
        msg = TaskCancelMessage(data=TaskCancelData(task_id=task_id, attempt=attempt))
        try:
            await conn.send(encode(msg))
        except Exception as exc:  # gone: it re-registers without the task, or finishes it
            log.info(
                "bridge %s: TASK_CANCEL for task %s not sent: %r",
                conn.bridge_id,
                task_id,
                exc,
                extra=ctx(task=task_id, bridge=conn.bridge_id),
            )
            return
        log.info(
            "bridge %s: task %s attempt %d cancelled",
            conn.bridge_id,
            task_id,
            attempt,
            extra=ctx(task=task_id, bridge=conn.bridge_id),
        )

    def remote_task_end(self, event: dict[str, Any]) -> None:
        """A task's end that another process heard of, for a bridge connected here (a
        ``bridge-end`` event): as :meth:`end_on` for an end heard here, the slot freed now
        rather than at the bridge's next HEARTBEAT, an attempt not the one that ended
        stopped. The bridge that ran it applies its failure count first (a failing bridge
        is out before reuse); after a machine's failure, the retry that waited for this
        slot may be dispatched now."""
        conn = self.registry.bridges.get(str(event.get("bridgeId")))
        task_id = str(event.get("taskId"))
        if conn is None:
            self._freed_by_another(event)
            return
        if not conn.slots.holds(task_id):
            return
        end, attempt, ran = _end_of(event), event.get("attempt"), bool(event.get("ran"))
        failures = event.get("failures")
        if ran and isinstance(failures, int) and self.rotation.apply(conn, failures, task_id):
            self._spawn(self.rotation.save(conn))
        held = conn.slots.attempt_of(task_id)
        self.end_on(conn, task_id, end, attempt if isinstance(attempt, int) else held)
        if ran and end in _RETRIED:
            self._spawn(self._release(task_id))

    def _freed_by_another(self, event: dict[str, Any]) -> None:
        """A third process's view of a ``bridge-end`` between two others: the slot of the
        bridge that ran the attempt, on the process holding it, counts as free elsewhere
        here from now, as on the process that sent the event, before the holder's next
        write of its free slots (with three processes or more, the one that neither heard
        the end nor holds the bridge planned the next task for a paid platform meanwhile)."""
        sender = event.get("from")
        if event.get("ran") and sender and sender != self.me and self.bridges_elsewhere():
            self.freed_elsewhere()

    async def _release(self, task_id: str) -> None:
        """The slot a machine failure's retry waited for is free here: our free slots are
        written for the other processes first, then the retry is made dispatchable (and
        dispatched here first: no ``wake`` goes to the others). Made dispatchable while
        the others still read the slot as taken, a process with no bridge planned it for
        a paid platform while this one was about to run it."""
        try:
            await self.published()
            if await self.released(task_id):
                self.wake()
        except REDIS_OUTAGE as exc:  # the retry is dispatchable after its short wait
            log.info("task %s: retry not released: %r", task_id, exc, extra=ctx(task=task_id))


def _end_of(event: dict[str, Any]) -> TaskEnd:
    """How the task ended, as a ``bridge-end`` event says (an older process's event says
    only whether it was cancelled)."""
    try:
        return TaskEnd(event["end"])
    except (KeyError, ValueError):
        return TaskEnd.CANCELLED if event.get("cancel") else TaskEnd.SUCCEEDED
