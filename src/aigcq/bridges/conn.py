"""One live bridge connection: its slots and its state, changed only through methods.

Every change to what the pick index depends on (free slots, load, online, rotation, drain)
goes through a method that tells the registry filing the bridge (see :mod:`.registry`).

Per instance (for a bridge that describes its instances): the state the bridge last
reported, and the tasks the hub placed there since (:attr:`BridgeConn.placed`, each until
a report shows where it runs): :meth:`BridgeConn.free_instances` are the slots a task can
be counted on now, each with what its instance offers.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from aigcq.bridges.slots import Assignment, SlotLedger
from aigcq.wire.bridge import InstanceInfo
from aigcq.wire.capabilities import Needs, offers_of

Send = Callable[[str], Awaitable[None]]

#: what ``aigcq status`` and the dashboard show of each instance
_SHOWN = {"instance_id", "state", "task_id", "device", "vram_total", "vram_free"}


class Filing(Protocol):
    """What indexes a bridge: told of every change, and of tasks taken on or let go."""

    def refile(
        self, conn: BridgeConn, added: Iterable[str] = (), gone: Iterable[str] = ()
    ) -> None: ...

    def offers_changed(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Instance:
    """One instance as its bridge last reported it."""

    instance_id: str
    state: str  # idle | busy | offline
    task_id: str | None  # the task it runs (busy)
    offer: Needs | None  # None: not known
    slots: int = 1


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
    #: what each instance that is not offline offers (None: not known, not ruled out;
    #: see :mod:`.capabilities`)
    offers: tuple[Needs, ...] | None = None
    #: what its offline instances offer: withdrawn until they are back
    withdrawn: tuple[Needs, ...] = ()
    #: each instance as the bridge last reported it (empty: it does not describe them)
    instances: tuple[Instance, ...] = ()
    #: taskId -> the instance the hub placed it on, until a report shows where it runs
    placed: dict[str, str] = field(default_factory=dict)
    #: instanceId -> the model files of the last task placed there (loaded, likely)
    warm: dict[str, frozenset[str]] = field(default_factory=dict)
    #: it sends CAPACITY when an instance's state changes (REGISTER ``capacityReports``)
    reports_capacity: bool = False
    #: the ``seq`` of the last CAPACITY applied (an older one is dropped)
    capacity_seq: int = -1
    #: the registry holding this connection, told of every change to the above
    owner: Filing | None = field(default=None, repr=False)
    #: :meth:`free_instances`, until the next change
    _free_spots: dict[Needs | None, list[str]] | None = field(default=None, repr=False)

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
        dashboard), what it offers (for routing; an offline one's is withdrawn) and what
        it runs (for placing)."""
        instances = instances or []
        self._free_spots = None
        self.instance_states = [i.model_dump(include=_SHOWN) for i in instances]
        self.instances = tuple(_instance(i) for i in instances)
        online = [i for i in instances if i.state != "offline"]
        offers = (offers_of(online) if online else ()) if instances else None
        withdrawn = tuple(i.offer for i in self.instances if i.state == "offline" and i.offer)
        if (offers, withdrawn) != (self.offers, self.withdrawn):
            self.offers, self.withdrawn = offers, withdrawn
            if self.owner is not None:
                self.owner.offers_changed()

    def can_run(self, needs: Needs) -> bool:
        """Whether one of its instances that is not offline has every node class and model
        file ``needs``."""
        return self.offers is None or any(o.covers(needs) for o in self.offers)

    def could_run(self, needs: Needs) -> bool:
        """Whether one of its offline instances could, were it back."""
        return any(o.covers(needs) for o in self.withdrawn)

    def free_instances(self) -> dict[Needs | None, list[str]]:
        """The slots a task can be counted on now, by what their instance offers: an
        instanceId per slot on an instance not offline, not running a task (as the bridge
        last reported, a task that ended here since not counted) nor holding one the hub
        placed there since; at most :meth:`free` of them. A bridge that does not describe
        its instances' offers: its free slots, on no instance in particular (""), able to
        run anything (``None``). Kept until the next change: not to be changed."""
        if self._free_spots is None:
            self._free_spots = self._count_free_instances()
        return self._free_spots

    def _count_free_instances(self) -> dict[Needs | None, list[str]]:
        free = self.free()
        if free <= 0:
            return {}
        if self.offers is None:
            return {None: [""] * free}
        taken = Counter(self.placed.values())
        for i in self.instances:
            counted = i.task_id is None or not self.slots.over(i.task_id)  # not ended here
            if i.state == "busy" and i.task_id not in self.placed and counted:
                taken[i.instance_id] += 1
        out: dict[Needs | None, list[str]] = {}
        for i in self.instances:
            room = 0 if i.state == "offline" else min(i.slots - taken[i.instance_id], free)
            if room > 0:
                out.setdefault(i.offer, []).extend([i.instance_id] * room)
                free -= room
        return out

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
        if described is not None:  # it shows where each acknowledged task runs now
            self.placed = {t: i for t, i in self.placed.items() if t in self.slots.pending}
        self._changed(gone=gone)
        if described is not None:
            self.describe(described)
        return gone

    def take(
        self,
        task_id: str,
        assignment: Assignment,
        instance_id: str = "",
        models: frozenset[str] = frozenset(),
    ) -> bool:
        """TASK_ASSIGN: a free slot for ``task_id``, counted on ``instance_id`` if given
        (whose ``models`` it loads)."""
        taken = self.slots.take(task_id, assignment)
        if taken and instance_id:
            self.placed[task_id] = instance_id
            if models:
                self.warm[instance_id] = models
        self._changed(added=[task_id] if taken else ())
        return taken

    def adopt(self, task_id: str, attempt: int) -> None:
        self.slots.adopt(task_id, attempt)
        self._changed(added=[task_id])

    def ack(self, task_id: str) -> Assignment | None:
        return self.slots.ack(task_id)  # a slot still taken: nothing to re-file

    def refuse(self, task_id: str, *, withhold: bool = True) -> Assignment | None:
        assignment = self.slots.refuse(task_id, withhold=withhold)
        self.placed.pop(task_id, None)
        self._changed(gone=[task_id] if assignment else ())
        return assignment

    def release(self, task_id: str) -> Assignment | None:
        assignment = self.slots.release(task_id)
        self.placed.pop(task_id, None)
        self._changed(gone=[task_id] if assignment else ())
        return assignment

    def release_all(self) -> dict[str, Assignment]:
        out = self.slots.release_all()
        self.placed.clear()
        self._changed(gone=list(out))
        return out

    def end(self, task_id: str, attempt: int | None = None, *, stopping: bool = False) -> bool:
        """The task ended here; with ``stopping`` (told to stop it) its slot stays taken
        until the bridge reports the instance free, if it sends such reports (and so does
        its instance, until a report shows it); if not, it is free now, and stopping again
        while a report still lists the task."""
        on_trust = stopping and not self.reports_capacity
        stopping = stopping and self.reports_capacity
        ended = self.slots.end(task_id, attempt, stopping=stopping, on_trust=on_trust)
        if ended and not stopping:
            self.placed.pop(task_id, None)
        self._changed(gone=[task_id] if ended else ())
        return ended

    def _changed(self, added: Iterable[str] = (), gone: Iterable[str] = ()) -> None:
        self._free_spots = None
        if self.owner is not None:
            self.owner.refile(self, added, gone)


def _instance(info: InstanceInfo) -> Instance:
    offer = None
    if info.node_classes is not None:
        offer = Needs(frozenset(info.node_classes), frozenset(info.models or ()))
    return Instance(info.instance_id, info.state, info.task_id, offer, info.slots or 1)
