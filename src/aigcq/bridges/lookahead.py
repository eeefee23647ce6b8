"""Claiming ahead: which waiting tasks of a queue the hub takes now (issue 24, item 3).

The dispatch loop claims from the head of a queue. When bridges describe what their
instances run, a task at the head that no free instance can run must not hold back the
tasks behind it that one can. So the hub looks at the first ``n`` +
``AIGCQ_BRIDGE_LOOKAHEAD`` waiting tasks (``n``: its free slots) and :func:`choose` says
which to claim, by id (``claim.lua`` takes each out of the list atomically): FIFO within
what the free instances can run (:class:`~aigcq.bridges.placing.Matching`), at most
``n``, and those to hand back now. A task left waiting keeps its place in the queue: it
is not claimed (no new attempt, never sent to be refused) until an instance that can run
it is free, or:

* an online instance here can run it but none is free: the queue's paid platform takes it
  once it has waited ``AIGCQ_OVERFLOW_AFTER_MS`` (as when every slot is busy), if it has
  room; else it waits;
* only an offline instance here could run it (what an offline instance offers is
  withdrawn): it goes to the paid platform as above, and once it has waited
  ``AIGCQ_NO_CAPABLE_WAIT_S`` for the instance to come back, to the paid platform at once
  or, when none serves its queue, it fails ``NoCapableInstance``;
* no instance here could run it, but a bridge of another process can (see
  :mod:`.peer_offers`): that process claims it; it goes to the paid platform after
  :data:`ELSEWHERE_WAIT_S`; only an offline instance elsewhere could: as one here;
* no connected instance could run it, but a bridge that left (a restart) within its grace
  (``AIGCQ_BRIDGE_GRACE_S``, see :mod:`.peer_offers`) could: it waits for that bridge,
  neither paid nor failed, weighed again every :data:`LEFT_RECHECK_S`;
* no instance of the cluster could run it: to the paid platform, or failing, at once.

:class:`Window` reads the candidates (id, needs, submit time; each task read once while
it waits).
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from aigcq.bridges.placing import Matching, Slot
from aigcq.plumbing.text import text
from aigcq.runtime import Runtime
from aigcq.scheduler.targets import Chosen
from aigcq.wire.capabilities import Needs

#: how long a task no bridge here can run waits for bridges of other processes to take it
ELSEWHERE_WAIT_S = 5.0
#: how often a task only a bridge that left can run is weighed again (its grace may be over)
LEFT_RECHECK_S = 1.0


class Reach(enum.Enum):
    """Where the instances that can run a task are, when no free one can."""

    BUSY = "busy"  # an online instance here can (or its needs are not known)
    OFFLINE = "offline"  # only an offline instance (here, else elsewhere) could
    ELSEWHERE = "elsewhere"  # none here could, a bridge of another process can
    LEFT = "left"  # none connected could, a bridge that left within its grace could
    NOWHERE = "nowhere"  # no instance of the cluster could


@dataclass(frozen=True, slots=True)
class Candidate:
    """A waiting task, as :func:`choose` weighs it."""

    task_id: str
    needs: Needs | None
    reach: Reach
    waited_s: float  # since its submit
    offline_s: float = 0.0  # how long only offline instances could run it


@dataclass(frozen=True, slots=True)
class Rules:
    n: int  # free slots to fill at most
    #: room on the queue's paid platform for tasks handed back (None: none serves it)
    paid_free: int | None
    overflow_after_s: float
    no_capable_wait_s: float


def choose(candidates: Sequence[Candidate], slots: Sequence[Slot], rules: Rules) -> Chosen:
    """The candidates to claim now, in queue order: placed on ``slots``, or handed back
    (see the module docstring); and when the first one left waiting is due. At most as
    many go to the paid platform as the ``n`` free slots the dispatch loop counted for
    this queue and could not fill (the others wait for the slots it keeps for them: one
    stopping a cancelled prompt, another process's)."""
    matching = Matching(slots)
    placed: set[str] = set()
    for c in candidates:
        if len(placed) < rules.n and matching.add(c.needs):
            placed.add(c.task_id)
    paid_left = min(rules.paid_free, rules.n - len(placed)) if rules.paid_free is not None else 0
    ids: list[str] = []
    wake: float | None = None
    for c in candidates:
        if c.task_id in placed:
            ids.append(c.task_id)
            continue
        back, due_in = _unplaced(c, rules, paid_left > 0)
        if back is not None:
            ids.append(c.task_id)
            paid_left -= back == "paid"
        elif due_in is not None:
            wake = due_in if wake is None else min(wake, due_in)
    return Chosen(ids, wake)


Back = Literal["paid", "fail"] | None


def _unplaced(c: Candidate, rules: Rules, room: bool) -> tuple[Back, float | None]:
    """A candidate no free slot takes: hand it back now (to the paid platform, or to
    fail), or (None, in how many seconds it is due; None: at a change of capacity)."""
    if c.reach is Reach.ELSEWHERE:
        return _to_paid(ELSEWHERE_WAIT_S - c.waited_s, room)
    if c.reach is Reach.LEFT:
        return None, LEFT_RECHECK_S
    if c.reach is Reach.NOWHERE:
        return ("fail", None) if rules.paid_free is None else _to_paid(0.0, room)
    paid_now, paid_in = _to_paid(rules.overflow_after_s - c.waited_s, room)
    if paid_now is not None or c.reach is Reach.BUSY:
        return paid_now, paid_in
    fail_in = rules.no_capable_wait_s - c.offline_s  # its instance had that long to return
    if fail_in <= 0:
        return ("fail", None) if rules.paid_free is None else _to_paid(0.0, room)
    return None, fail_in if paid_in is None else min(paid_in, fail_in)


def _to_paid(due_in: float, room: bool) -> tuple[Back, float | None]:
    if not room:
        return None, None
    return ("paid", None) if due_in <= 0 else (None, due_in)


NeedsOf = Callable[[dict[str, Any], str], Awaitable[Needs | None]]


class Window:
    """The head of a queue as :func:`choose` weighs it: each waiting task's id, needs and
    submit time, read once per task and kept while it waits (at most :attr:`KEPT`)."""

    KEPT = 4096

    def __init__(self, rt: Runtime, needs_of: NeedsOf) -> None:
        self.rt = rt
        self.needs_of = needs_of
        self._seen: OrderedDict[str, tuple[Needs | None, float]] = OrderedDict()

    async def read(
        self, aigc: str, platform: str, size: int, among: Sequence[str] | None = None
    ) -> list[tuple[str, Needs | None, float]]:
        """The first ``size`` waiting tasks of the queue (or of ``among``, waiting tasks
        of it in queue order): (taskId, needs, submit time)."""
        keys, redis = self.rt.store.keys, self.rt.redis
        if among is not None:
            ids = list(among[:size])
        else:
            ids = [text(i) for i in await redis.zrange(keys.wait(aigc, platform), 0, size - 1)]
        unread = [i for i in ids if i not in self._seen]
        if unread:
            pipe = redis.pipeline(transaction=False)
            for task_id in unread:
                pipe.hmget(keys.task(task_id), "payload", "workflowId", "created")
            for task_id, (payload, workflow_id, created) in zip(
                unread, await pipe.execute(), strict=True
            ):
                if payload is None:  # gone meanwhile
                    continue
                needs = await self.needs_of(_payload(payload), text(workflow_id or ""))
                self._seen[task_id] = (needs, float(created or time.time()))
            while len(self._seen) > self.KEPT:
                self._seen.popitem(last=False)
        return [(t, *self._seen[t]) for t in ids if t in self._seen]

    def forget(self, task_id: str) -> None:
        """``task_id`` is no longer waiting (claimed)."""
        self._seen.pop(task_id, None)


def _payload(raw: Any) -> dict[str, Any]:
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return payload if isinstance(payload, dict) else {}
