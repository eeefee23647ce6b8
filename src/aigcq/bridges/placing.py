"""Which free slot each task goes to: a matching of tasks to instances (pure, no I/O).

A :class:`Slot` is one prompt an instance can take now (see
:meth:`~aigcq.bridges.conn.BridgeConn.free_instances`), with what its instance offers.
Tasks are added in queue order; each is placed if it and every task placed before it can
all be put on slots that :func:`~aigcq.wire.capabilities.fits` them. A task placed
earlier is never dropped for one behind it, but it may move to another slot that fits it
to make room (an augmenting path, as in bipartite matching): a basic task counted on the
only instance that can run a special one moves to a basic instance when the special task
comes. So the tasks placed are FIFO within what the free instances can run.

Slots are grouped by what they offer (a fleet has a few kinds of instance, not one per
slot), narrowest first: a task takes the narrowest kind that fits it, keeping versatile
instances for the tasks only they can run. :meth:`Matching.spots` then gives each placed
task a slot of its kind, in the order given (the hub lists the least-loaded bridges first)
or one it prefers (its models already loaded there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

from aigcq.wire.capabilities import Needs, breadth, fits


class Slot(NamedTuple):
    """One prompt an instance can take now."""

    owner: Any  # the bridge holding it
    instance_id: str  # "": the bridge does not describe its instances
    offer: Needs | None  # None: not known (runs anything)


class Matching:
    """Tasks placed on ``slots`` so far (see the module docstring)."""

    def __init__(self, slots: Sequence[Slot]) -> None:
        by_offer: dict[Needs | None, list[int]] = {}
        for i, slot in enumerate(slots):
            by_offer.setdefault(slot.offer, []).append(i)
        self.slots = list(slots)
        self._offers = sorted(by_offer, key=breadth)
        self._members = [by_offer[offer] for offer in self._offers]
        self._held: list[list[int]] = [[] for _ in self._offers]  # tasks, per kind
        self._fitting: list[list[int]] = []  # per task: the kinds that fit it
        #: per task added: the kind of slot it is placed on (None: not placed)
        self.kind: list[int | None] = []

    def add(self, needs: Needs | None) -> bool:
        """Place one more task (the next in queue order); False: it cannot be placed
        without dropping one placed before it (nothing changes then)."""
        task = len(self.kind)
        self._fitting.append([k for k, offer in enumerate(self._offers) if fits(offer, needs)])
        self.kind.append(None)
        return self._augment(task, set())

    def _augment(self, task: int, seen: set[int]) -> bool:
        """Place ``task``: on a kind with room, else on one whose tasks can move (each
        kind tried once per search)."""
        fitting = [kind for kind in self._fitting[task] if kind not in seen]
        for kind in fitting:
            if len(self._held[kind]) < len(self._members[kind]):
                return self._put(task, kind)
        for kind in fitting:
            if kind in seen:
                continue
            seen.add(kind)
            held = self._held[kind]
            for other in list(held):
                if self._augment(other, seen):  # it moved to another kind that fits it
                    held.remove(other)
                    return self._put(task, kind)
        return False

    def _put(self, task: int, kind: int) -> bool:
        self._held[kind].append(task)
        self.kind[task] = kind
        return True

    def spots(
        self,
        allowed: Callable[[int, Slot], bool] = lambda _task, _slot: True,
        prefer: Callable[[int, Slot], bool] = lambda _task, _slot: False,
    ) -> list[Slot | None]:
        """Each added task's slot: of its kind, the first that is ``allowed`` for it in the
        order given, or a later one it would ``prefer`` among the first :data:`SCAN`
        allowed; None: not placed, or no such slot left."""
        out: list[Slot | None] = [None] * len(self.kind)
        for kind, held in enumerate(self._held):
            left = [self.slots[i] for i in self._members[kind]]
            for task in sorted(held):
                at = _pick(left, partial(allowed, task), partial(prefer, task))
                if at is not None:
                    out[task] = left.pop(at)
        return out


#: how many allowed slots a task looks through for one it prefers (its models loaded)
SCAN = 64


def _pick(
    left: list[Slot], allowed: Callable[[Slot], bool], prefer: Callable[[Slot], bool]
) -> int | None:
    first = None
    seen = 0
    for at, slot in enumerate(left):
        if not allowed(slot):
            continue
        if prefer(slot):
            return at
        first = at if first is None else first
        seen += 1
        if seen >= SCAN:
            break
    return first
