"""One live bridge connection: its slots and its state, changed only through methods.

Every change to what the pick index depends on (free slots, load, online, rotation, drain)
goes through a method that tells the registry filing the bridge (see :mod:`.registry`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from aigcq.bridges.capabilities import Needs, offers_of
from aigcq.bridges.protocol import InstanceInfo
from aigcq.bridges.slots import Assignment, SlotLedger

Send = Callable[[str], Awaitable[None]]

#: what ``aigcq status`` and the dashboard show of each instance
_SHOWN = {"instance_id", "state", "task_id", "device", "vram_total", "vram_free"}


class Filing(Protocol):
    """What indexes a bridge: told of every change, and of tasks taken on or let go."""

    def refile(
        self, conn: BridgeConn, added: Iterable[str] = (), gone: Iterable[str] = ()
    ) -> None: ...

    def offers_changed(self) -> None: ...


@dataclass(slots=True, eq=False)
class BridgeConn:
    """One live bridge connection: its slots (:class:`SlotLedger`) and its state.

    Everything the pick index depends on (free slots, load, online, rotation, drain)
    changes through a method here, which re-files the bridge in its registry."""

    bridge_id: str
    send: Send
    slots: SlotLedger = field(default_factory=SlotLedger)
    online: bool = True
    last_seen: float = field(default_factory=time.monotonic)  # last message of any kind
    last_pong: float = 0.0
    failures: int = 0  # consecutive failed TASK_ENDs
    quarantined_at: float | None = None  # out of rotation since (monotonic)
    drained: bool = False  # by an operator: no new tasks, running ones finish
    #: each instance as the bridge last reported it: {"instanceId", "state", "taskId"},
    #: and its device and VRAM when the bridge reports them
    instance_states: list[dict[str, Any]] = field(default_factory=list)
    #: what each instance offers (None: not known, not ruled out; see :mod:`.capabilities`)
    offers: tuple[Needs, ...] | None = None
    #: it sends CAPACITY when an instance's state changes (REGISTER ``capacityReports``)
    reports_capacity: bool = False
    #: the ``seq`` of the last CAPACITY applied (an older one is dropped)
    capacity_seq: int = -1
    #: the registry holding this connection, told of every change to the above
    owner: Filing | None = field(default=None, repr=False)

    # ---- read-only views ---------------------------------------------------------------

    @property
    def instance_count(self) -> int:
        return self.slots.instances

    @property
    def pending(self) -> dict[str, Assignment]:
        return self.slots.pending

    @property
    def running(self) -> dict[str, int]:
        return self.slots.running

    def describe(self, instances: list[InstanceInfo] | None) -> None:
        """Each instance as the bridge reported it: its state (for ``aigcq status`` and the
        dashboard) and what it offers (for routing)."""
        self.instance_states = [i.model_dump(include=_SHOWN) for i in instances or []]
        offers = offers_of(instances)
        if offers != self.offers:
            self.offers = offers
            if self.owner is not None:
                self.owner.offers_changed()

    def can_run(self, needs: Needs) -> bool:
        """Whether one of its instances has every node class and model file ``needs``."""
        return self.offers is None or any(o.covers(needs) for o in self.offers)

    def free(self) -> int:
        usable = self.online and self.quarantined_at is None and not self.drained
        return self.slots.free if usable else 0

    def load(self) -> float:
        """Share of instances in use (0 = idle); least-loaded bridges are picked first."""
        if self.slots.instances <= 0:
            return 1.0
        return 1.0 - self.free() / self.slots.instances

    # ---- changes (each re-files the bridge) --------------------------------------------

    def set_state(
        self,
        *,
        online: bool | None = None,
        drained: bool | None = None,
        quarantined_at: float | Literal["keep"] | None = "keep",
    ) -> None:
        if online is not None:
            self.online = online
        if drained is not None:
            self.drained = drained
        if quarantined_at != "keep":
            self.quarantined_at = quarantined_at
        self._changed()

    def report(
        self,
        instances: int,
        available: int,
        held: Collection[str] | None = None,
        described: list[InstanceInfo] | None = None,
    ) -> list[str]:
        """REGISTER / HEARTBEAT / CAPACITY / refusal counts (see :meth:`SlotLedger.report`),
        with the instances as described in the same report (then also :meth:`describe`d);
        a sign of life."""
        self.last_seen = time.monotonic()
        busy_with = [i.task_id for i in described or () if i.state == "busy" and i.task_id]
        gone = self.slots.report(instances, available, held, busy_with)
        self._changed(gone=gone)
        if described is not None:
            self.describe(described)
        return gone

    def take(self, task_id: str, assignment: Assignment) -> bool:
        taken = self.slots.take(task_id, assignment)
        self._changed(added=[task_id] if taken else ())
        return taken

    def adopt(self, task_id: str, attempt: int) -> None:
        self.slots.adopt(task_id, attempt)
        self._changed(added=[task_id])

    def ack(self, task_id: str) -> Assignment | None:
        return self.slots.ack(task_id)  # a slot still taken: nothing to re-file

    def refuse(self, task_id: str, *, withhold: bool = True) -> Assignment | None:
        assignment = self.slots.refuse(task_id, withhold=withhold)
        self._changed(gone=[task_id] if assignment else ())
        return assignment

    def release(self, task_id: str) -> Assignment | None:
        assignment = self.slots.release(task_id)
        self._changed(gone=[task_id] if assignment else ())
        return assignment

    def release_all(self) -> dict[str, Assignment]:
        out = self.slots.release_all()
        self._changed(gone=list(out))
        return out

    def end(self, task_id: str, attempt: int | None = None, *, stopping: bool = False) -> bool:
        """The task ended here; with ``stopping`` (told to stop it) its slot stays taken
        until the bridge reports the instance free, if it sends such reports."""
        ended = self.slots.end(task_id, attempt, stopping=stopping and self.reports_capacity)
        self._changed(gone=[task_id] if ended else ())
        return ended

    def _changed(self, added: Iterable[str] = (), gone: Iterable[str] = ()) -> None:
        if self.owner is not None:
            self.owner.refile(self, added, gone)
