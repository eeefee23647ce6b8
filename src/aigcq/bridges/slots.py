"""One bridge's slots: which are free, which hold a task of ours, which the bridge withholds.

The one invariant: ``free + pending + running + stopping + withheld - credited ==
instances`` (the
instance count the bridge last reported), no term ever negative. Should the bridge report
fewer instances than our tasks on it, ``free`` is 0 until enough of them end. A task's slot is freed
exactly once per end of that task, whichever way it ends: a TASK_END applied or refused,
a cancel, an ACK that never came, a refusal, the bridge saying it no longer holds it.

* ``pending``: TASK_ASSIGN sent, no TASK_ACK yet (with the timer that gives it back).
* ``running``: acknowledged, until the task ends (taskId -> attempt).
* ``withheld``: slots the bridge counts busy that are not ours (an instance offline, a
  prompt queued by someone else, a refusal "no instance free"); fixed at each report.
* ``stopping``: tasks we no longer want (cancelled, superseded) on a bridge that reports
  its capacity (CAPACITY): their instance is busy until the bridge says it is free (ComfyUI
  takes about a second to stop a prompt), so their slot is not offered before then. On a
  bridge that does not, their slot is freed on trust, and is stopping again when a report
  (a HEARTBEAT, a refusal's counts) still lists the task: the refusal of the next task
  offered there says "still stopping", not "no capacity".
* ``credited``: acknowledged tasks the bridge already counts free (it finished them, their
  TASK_END is on its way): their slots are free now, and their end does not free them again.

No I/O: the hub applies what the bridge and the queue say, this class keeps the count.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass

#: how many ended-before-acknowledged task ids are kept (to drop their late TASK_ACK)
ENDED_EARLY_KEPT = 1024


@dataclass(slots=True)
class Assignment:
    """A TASK_ASSIGN sent and not yet acknowledged."""

    attempt: int
    aigc: str
    platform: str
    backend_id: str = ""
    workflow_id: str = ""
    timer: asyncio.TimerHandle | None = None
    remote_id: str = ""  # a seed-002 bridge's own taskId, once it acknowledged
    charged: int = 1  # attempts charged to the task's budget, this one included
    task_id: str = ""

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class SlotLedger:
    """Slot accounting of one bridge (see the module docstring for the invariant)."""

    __slots__ = (
        "_ended",
        "_ended_early",
        "_freed_on_trust",
        "_stopping_since",
        "credited",
        "instances",
        "pending",
        "running",
        "stopping",
        "withheld",
    )

    def __init__(self, instances: int = 0, available: int | None = None) -> None:
        self.instances = 0
        self.withheld = 0
        self.credited = 0
        self.pending: dict[str, Assignment] = {}
        self.running: dict[str, int] = {}  # taskId -> attempt
        #: taskId -> its slots being stopped (an id may be stopped on two attempts)
        self.stopping: dict[str, int] = {}
        #: taskId -> when it was first told to stop (monotonic s): see :meth:`stopping_soon`
        self._stopping_since: dict[str, float] = {}
        self._ended_early: OrderedDict[str, None] = OrderedDict()
        #: acknowledged tasks that ended here lately: a report still listing one was built
        #: before its end, and counts its slot busy only because of that
        self._ended: OrderedDict[str, None] = OrderedDict()
        #: tasks told to stop on a bridge that does not say when their instance is free:
        #: their slot was freed at once; a report that still lists one shows it stopping
        self._freed_on_trust: OrderedDict[str, None] = OrderedDict()
        if instances:
            self.report(instances, instances if available is None else available)

    @property
    def free(self) -> int:
        return max(0, self.instances - self.withheld - self.used + self.credited)

    @property
    def used(self) -> int:
        """Slots holding a task of ours (acknowledged or not, or being stopped)."""
        return len(self.pending) + len(self.running) + self.stopped

    @property
    def stopped(self) -> int:
        """Slots of tasks being stopped (their instance not yet free on the bridge)."""
        return sum(self.stopping.values())

    def stopping_soon(self, within_s: float, now: float | None = None) -> int:
        """Slots being stopped that were told to stop less than ``within_s`` ago: free
        within about a second as ComfyUI lets a prompt go. One stopping longer (a bridge
        that never reports it let go) stays busy here but is no longer promised to
        anyone as about to be free."""
        since = time.monotonic() - within_s if now is None else now - within_s
        return sum(n for t, n in self.stopping.items() if self._stopping_since.get(t, 0) >= since)

    def holds(self, task_id: str) -> bool:
        return task_id in self.running or task_id in self.pending

    def over(self, task_id: str) -> bool:
        """Whether ``task_id`` ended here and is not here again: a report that shows it
        busy was built before that end."""
        return task_id in self._ended and not self.holds(task_id) and task_id not in self.stopping

    def attempt_of(self, task_id: str) -> int | None:
        pending = self.pending.get(task_id)
        return pending.attempt if pending is not None else self.running.get(task_id)

    # ---- what the bridge reports -----------------------------------------------------

    def report(
        self,
        instances: int,
        available: int,
        held: Collection[str] | None = None,
        busy_with: Collection[str] = (),
    ) -> list[str]:
        """The bridge's count (REGISTER, HEARTBEAT, a refusal's counts). With ``held`` (the
        task ids the bridge still holds), acknowledged tasks it no longer holds have ended:
        their slots are freed and their ids returned. Assignments it has not acknowledged
        are not in its count yet: they stay taken. ``busy_with``: the task ids its busy
        instances run; one that already ended here means the report was built before that
        end, which it cannot undo (that instance counts free)."""
        gone = [t for t in self.running if t not in held] if held is not None else []
        for task_id in gone:
            del self.running[task_id]
        if held is not None and self._freed_on_trust:
            # a task freed on trust that it still holds is still stopping; one it no
            # longer holds, it let go
            listed = set(held)
            for task_id in list(self._freed_on_trust):
                del self._freed_on_trust[task_id]
                if task_id in listed and not self.holds(task_id) and task_id not in self.stopping:
                    self._stop(task_id)
        if held is not None:  # a stopped task it no longer holds: its instance is free
            for task_id in [t for t in self.stopping if t not in held]:
                del self.stopping[task_id]
                self._stopping_since.pop(task_id, None)
        self.instances = max(0, instances)
        busy = max(0, self.instances - max(0, available))
        busy = max(0, busy - sum(1 for t in set(busy_with) if self.over(t)))
        # busy by its count beyond our acknowledged tasks: someone else's (or offline);
        # fewer busy than our tasks: some finished, their TASK_END not here yet
        ours = len(self.running) + self.stopped
        self.withheld = max(0, busy - ours)
        self.credited = max(0, ours - busy)
        return gone

    def adopt(self, task_id: str, attempt: int) -> None:
        """An acknowledged task the bridge still holds after it reconnected: one of the
        slots it counted busy is ours."""
        if self.holds(task_id):
            return
        self.running[task_id] = attempt
        if self.withheld > 0:
            self.withheld -= 1
        else:  # it counts the slot free: the prompt is done, its TASK_END on its way
            self.credited += 1

    # ---- one task's way through ------------------------------------------------------

    def take(self, task_id: str, assignment: Assignment) -> bool:
        """TASK_ASSIGN: take a free slot for ``task_id`` (``False``: none free, or the
        task is already here)."""
        if self.free <= 0 or self.holds(task_id):
            return False
        self.pending[task_id] = assignment
        return True

    def ack(self, task_id: str) -> Assignment | None:
        """TASK_ACK code 0: the task runs; ``None`` if it was not awaiting an ACK."""
        assignment = self.pending.pop(task_id, None)
        if assignment is not None:
            assignment.stop_timer()
            self.running[task_id] = assignment.attempt
        return assignment

    def refuse(self, task_id: str, *, withhold: bool = True) -> Assignment | None:
        """TASK_ACK with a non-zero code: the task leaves. With ``withhold`` (a bare "no
        free instance" from a bridge that sent no counts) the bridge is taken at its word
        that it has no room: the slot stays busy (withheld) until its next report; without
        (a refusal that says nothing about capacity, or that carries the bridge's counts,
        applied next by :meth:`report`) the slot is free at once."""
        assignment = self._unpend(task_id)
        if assignment is not None and withhold:
            self.withheld += 1
        return assignment

    def release(self, task_id: str) -> Assignment | None:
        """No TASK_ACK in time: the task leaves, its slot is free."""
        return self._unpend(task_id)

    def release_all(self) -> dict[str, Assignment]:
        """Every unacknowledged task leaves (bridge lost, shutdown), slots free."""
        out, self.pending = self.pending, {}
        for assignment in out.values():
            assignment.stop_timer()
        return out

    def end(
        self,
        task_id: str,
        attempt: int | None = None,
        *,
        stopping: bool = False,
        on_trust: bool = False,
    ) -> bool:
        """The task ended (any way): free its slot. ``attempt``, if given, must be the one
        held here. ``True`` only the first time. A task that ends before its TASK_ACK came
        is remembered so that late ACK is dropped (see :meth:`ended_early`). With
        ``stopping`` (the bridge is told to stop it and reports when its instance is free)
        the slot stays taken until a report no longer lists the task; with ``on_trust``
        (told to stop it, and it does not report that) the slot is free now, and stopping
        again if a report still lists the task (see :meth:`report`)."""
        held = self.attempt_of(task_id)
        if attempt is not None and held not in (attempt, None):
            return False
        if self.running.pop(task_id, None) is not None:
            if stopping:
                self._stop(task_id)
            elif self.credited > 0:  # freed already when the bridge counted it free
                self.credited -= 1
            elif on_trust:
                _remember(self._freed_on_trust, task_id)
            _remember(self._ended, task_id)
            return True
        if self._unpend(task_id) is None:
            return False
        if stopping:
            self._stop(task_id)
        _remember(self._ended_early, task_id)
        return True

    def ended_early(self, task_id: str) -> bool:
        """Whether ``task_id`` ended before its TASK_ACK (asked once, by that ACK)."""
        return self._ended_early.pop(task_id, 0) is None

    def _stop(self, task_id: str) -> None:
        self.stopping[task_id] = self.stopping.get(task_id, 0) + 1
        self._stopping_since.setdefault(task_id, time.monotonic())

    def _unpend(self, task_id: str) -> Assignment | None:
        assignment = self.pending.pop(task_id, None)
        if assignment is not None:
            assignment.stop_timer()
        return assignment


def _remember(kept: OrderedDict[str, None], task_id: str) -> None:
    kept[task_id] = None
    kept.move_to_end(task_id)
    while len(kept) > ENDED_EARLY_KEPT:
        kept.popitem(last=False)
