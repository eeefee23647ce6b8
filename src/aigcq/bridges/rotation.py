"""Which bridges are in rotation: consecutive failed tasks take a bridge out, a success or
a cool-down brings it back.

The count is the bridge's, in Redis, whichever process receives the TASK_END; the process
holding the bridge's connection applies it (told by :mod:`.endings` when another process
counted it). Only a machine's failure counts: a task that
failed through its own fault (an invalid workflow, a bad node value) leaves the count alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aigcq.bridges.health_monitor import HealthMonitor
from aigcq.bridges.registry import BridgeConn, BridgeRegistry, Counted
from aigcq.observability.jsonlog import ctx
from aigcq.runtime import Runtime

log = logging.getLogger(__name__)


class Rotation:
    def __init__(
        self,
        rt: Runtime,
        registry: BridgeRegistry,
        health: HealthMonitor,
        wake: Callable[[], None],
    ) -> None:
        self.rt = rt
        self.registry = registry
        self.health = health
        self.wake = wake

    @property
    def quarantine_s(self) -> float:
        return self.rt.settings.bridge_quarantine_s

    async def count_end(
        self, task_id: str, ok: bool | None, conn: BridgeConn | None, attempt: int | None
    ) -> Counted | None:
        """Count the end of ``attempt`` against the bridge that ran it (``ok`` ``None``: no
        count, only forget where it ran), applied here if that bridge is connected here;
        what was recorded (``None``: Redis away, the next TASK_END counts again)."""
        fallback = conn.bridge_id if conn else ""
        try:
            counted = await self.registry.count_end(task_id, ok, attempt, fallback)
        except Exception as exc:
            log.warning(
                "task %s: bridge failure count not updated: %r",
                task_id,
                exc,
                extra=ctx(task=task_id, bridge=fallback or None),
            )
            return None
        owner = self.registry.bridges.get(counted.ran)
        shared = counted.failures
        if owner and ok is not None and shared is not None and self.apply(owner, shared, task_id):
            await self.registry.save(owner)
        return counted

    async def save(self, conn: BridgeConn, *, failures: int | None = None) -> None:
        """Save ``conn`` (setting its shared failure count to ``failures``, if given) and
        apply the shared count, which TASK_ENDs received by other processes change."""
        shared = await self.registry.save(conn, failures=failures)
        if conn.online and self.apply(conn, shared, None):
            await self.registry.save(conn)

    def last_straw(self, conn: BridgeConn) -> bool:
        """Whether one more failed task takes ``conn`` out of rotation (by the count it had
        when last applied here)."""
        return conn.failures + 1 >= self.rt.settings.bridge_failure_limit

    def apply(self, conn: BridgeConn, failures: int, task_id: str | None) -> bool:
        """Quarantine at ``bridge_failure_limit`` failures in a row, re-admit below it (a
        success resets the count); ``True`` if that changed the bridge's rotation."""
        conn.failures = failures
        limit = self.rt.settings.bridge_failure_limit
        if conn.quarantined_at is None and failures >= limit:
            conn.set_state(quarantined_at=time.monotonic())
            log.warning(
                "bridge %s: out of rotation after %d failed tasks in a row (last: task %s)",
                conn.bridge_id,
                conn.failures,
                task_id or "?",
                extra=ctx(task=task_id, bridge=conn.bridge_id),
            )
            self.health.poke()
            return True
        if conn.quarantined_at is not None and failures < limit:
            self.readmit(conn, f"task {task_id or '?'} succeeded")
            return True
        return False

    def probation(self, conn: BridgeConn, available: int) -> int | None:
        """A quarantined bridge reporting free instances after ``bridge_quarantine_s`` is
        back, on probation (one more failure and it is out again): its new failure count."""
        cooled = time.monotonic() - (conn.quarantined_at or 0.0) >= self.quarantine_s
        if conn.quarantined_at is None or not cooled or available <= 0:
            return None
        conn.failures = self.rt.settings.bridge_failure_limit - 1
        self.readmit(conn, "heartbeat with free instances after cool-down")
        return conn.failures

    def readmit(self, conn: BridgeConn, why: str) -> None:
        conn.set_state(quarantined_at=None)
        log.warning(
            "bridge %s: back in rotation (%s)",
            conn.bridge_id,
            why,
            extra=ctx(bridge=conn.bridge_id),
        )
        self.wake()
