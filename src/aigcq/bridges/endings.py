"""A task's end on the bridges here: free its slot, stop what is no longer wanted, count.

Whichever way a task ends (its TASK_END applied, or refused as gone; a cancel), the
bridge holding it gets its slot back at once (a failure that may take the bridge out of
rotation: once counted). A bridge still running a cancelled or
superseded attempt is told to stop (TASK_CANCEL). A machine's failure counts against the
bridge, a success resets the count (see :mod:`.rotation`); the task's own failure does not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aigcq.bridges.protocol import TaskCancelData, TaskCancelMessage, encode
from aigcq.bridges.registry import BridgeConn, BridgeRegistry
from aigcq.bridges.rotation import Rotation
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import Spawner
from aigcq.scheduler.ends import TaskEnd

log = logging.getLogger(__name__)

_COUNTED = {TaskEnd.SUCCEEDED: True, TaskEnd.FAILED: False}


class TaskEnds:
    def __init__(
        self, name: str, registry: BridgeRegistry, rotation: Rotation, wake: Callable[[], None]
    ) -> None:
        self.name = name
        self.registry = registry
        self.rotation = rotation
        self.wake = wake
        self._spawn = Spawner()

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
        if end is TaskEnd.GONE:
            return  # a bridge elsewhere frees it when it stops listing the task
        self._spawn(self._count(task_id, end, ran, attempt, free_after=last_straw))

    async def _count(
        self,
        task_id: str,
        end: TaskEnd,
        ran: BridgeConn | None,
        attempt: int | None,
        *,
        free_after: bool,
    ) -> None:
        """Count the end; with ``free_after``, free the slot of the bridge that ran it
        after the count, however the count went (Redis away while saving it)."""
        cancel = end is TaskEnd.CANCELLED
        try:
            await self.rotation.count_end(task_id, _COUNTED.get(end), ran, cancel=cancel)
        finally:
            if ran is not None and free_after:
                self.end_on(ran, task_id, end, attempt)

    def end_on(self, conn: BridgeConn, task_id: str, end: TaskEnd, attempt: int | None) -> None:
        held = conn.slots.attempt_of(task_id)
        if held is None or (end is TaskEnd.GONE and attempt not in (None, held)):
            return  # a newer attempt runs there: its slot stays taken
        stop = end is TaskEnd.CANCELLED or (end is not TaskEnd.GONE and held != attempt)
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

    def remote_task_end(self, end: dict[str, Any]) -> None:
        """A task end that another process received, for a bridge connected here: free
        the slot now rather than at the bridge's next HEARTBEAT, apply the bridge's
        failure count first (a failing bridge is out before reuse), stop a cancelled task."""
        conn = self.registry.bridges.get(str(end.get("bridgeId")))
        task_id = str(end.get("taskId"))
        if conn is None or not conn.slots.holds(task_id):
            return
        if self.rotation.apply(conn, int(end.get("failures", 0)), task_id):
            self._spawn(self.rotation.save(conn))
        kind = TaskEnd.CANCELLED if end.get("cancel") else TaskEnd.SUCCEEDED
        self.end_on(conn, task_id, kind, conn.slots.attempt_of(task_id))
