"""Position and ETA of waiting tasks (issue 27 item 4): pure functions, no I/O.

The estimate is the planner's own: the heads of the queues our GPUs serve (up to a
window of each) are laid out by :func:`aigcq.scheduler.policy.plan_round` over the whole
internal pool (every process's free slots, and the expected time left of each busy one),
and each task's place in that order is its **position** (0-based: how many waiting tasks
are expected to start on our GPUs before it; 0 = it starts next) and its start there its
**ETA** (epoch seconds; None = unknown: nothing of ours can run it, or it is further back
than the window). A queue our GPUs do not serve (a paid platform's own) has positions by
its list alone (the tasks ahead of it in its queue) and no ETA.

A task submitted after the last layout is placed by :func:`place_new`: each fully read
queue gets a probe at its tail in the layout (a task of the queue's project submitted
then, with no run time of its own, so it moves nobody), and a new task takes that place,
one more for each task queued ahead of it since. Places further back than the layout are
laid out too, after every task read (a project of infinite usage, tasks of the read ones'
mean run time): :data:`BEYOND` of them, and beyond those the last one's start.
:func:`material` says when an estimate moved enough to tell the client again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from aigcq.scheduler.policy import Pool, Queue, Shares, Tuning, Waiting, plan_round

#: a probe's run time: it holds its slot for no time worth counting
PROBE_RUN_S = 1e-6
#: the project of the places beyond the layout: its usage is infinite, so its tasks come
#: after every task read (no task id and no project holds a NUL)
_LAST = "\0last"
_LAST_QUEUE = (_LAST, "")
#: places beyond the layout estimated (further back: the last one's start, a lower bound)
BEYOND = 64
#: the planner's knobs by default
PLAIN = Tuning()
#: an ETA moved by less than this (seconds) is not news
MIN_SHIFT_S = 2.0
#: ... nor by less than this share of the wait that was left
SHIFT_SHARE = 0.2


@dataclass(frozen=True, slots=True)
class Estimate:
    """Where a waiting task stands: ``position`` (0-based, None: unknown) and ``eta``
    (estimated internal start, epoch seconds; None: unknown)."""

    position: int | None = None
    eta: float | None = None

    def wire(self, now: float) -> dict[str, int | None]:
        """As clients read it: ``position`` and ``etaStartMs`` (epoch milliseconds, never
        before ``now``)."""
        eta = None if self.eta is None else int(max(self.eta, now) * 1000)
        return {"position": self.position, "etaStartMs": eta}


UNKNOWN = Estimate()


@dataclass(frozen=True, slots=True)
class Line:
    """One queue's head as the estimator read it."""

    queue: Queue
    #: its first waiting tasks, in list order, as the planner sees them (a queue our GPUs
    #: do not serve: only their ids count)
    tasks: Sequence[Waiting]
    #: how many wait in all (LLEN)
    length: int
    #: our GPUs run its platform
    served: bool
    #: every waiting task of the queue was read
    whole: bool


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The estimates of one layout, made at ``at``."""

    at: float
    #: every task read: its estimate
    tasks: Mapping[str, Estimate] = field(default_factory=dict)
    #: each fully read queue: where a task queued at its tail then would stand
    tails: Mapping[Queue, Estimate] = field(default_factory=dict)
    #: each queue's length then
    lengths: Mapping[Queue, int] = field(default_factory=dict)
    #: the estimated start of each place of the pool's order (non-decreasing; inf: never)
    starts: Sequence[float] = ()
    #: the estimated start of each place after every task read (:data:`BEYOND` of them)
    after: Sequence[float] = ()


def snapshot(
    lines: Sequence[Line],
    pool: Pool,
    shares: Shares,
    now: float,
    beyond_run_s: float,
    tuning: Tuning = PLAIN,
) -> Snapshot:
    """Every read task's estimate, and each fully read queue's tail (see the module's
    docstring). ``pool``: our GPUs, every slot counted whichever process holds it;
    ``beyond_run_s``: the run time of each place beyond the layout; ``shares`` and
    ``tuning``: the policy's (the paid platforms are left out: the estimate is of a start
    on our GPUs)."""
    tasks: dict[str, Estimate] = {}
    tails: dict[Queue, Estimate] = {}
    waiting: list[Waiting] = []
    probes: dict[str, Queue] = {}
    for line in lines:
        if not line.served:
            tasks.update((t.task_id, Estimate(i)) for i, t in enumerate(line.tasks))
            if line.whole:
                tails[line.queue] = Estimate(line.length)
            continue
        waiting += line.tasks
        if line.whole:
            probe = "\0tail " + " ".join(line.queue)  # no task id has a NUL
            probes[probe] = line.queue
            waiting.append(Waiting(probe, line.queue, now, PROBE_RUN_S))
    beyond = [f"{_LAST} {i}" for i in range(BEYOND)]
    waiting += [Waiting(b, _LAST_QUEUE, now, beyond_run_s) for b in beyond]
    last = replace(shares, usage={**shares.usage, _LAST: math.inf})
    whole = Pool(0, max(pool.free, 0) + max(pool.free_elsewhere, 0), pool.busy_s)
    decision = plan_round(waiting, whole, last, {}, now, tuning)
    starts: list[float] = []
    for task_id in decision.order:
        start = decision.eta.get(task_id, math.inf)
        estimate = Estimate(len(starts), None if math.isinf(start) else start)
        if task_id in probes:
            tails[probes[task_id]] = estimate
        elif not task_id.startswith(_LAST):
            tasks[task_id] = estimate
            starts.append(start)
    lengths = {line.queue: line.length for line in lines}
    after = [decision.eta.get(b, math.inf) for b in beyond]
    return Snapshot(now, tasks, tails, lengths, starts, after)


def place_new(snap: Snapshot, queue: Queue, index: int) -> Estimate:
    """The estimate of a task now at ``index`` (0-based) of ``queue``'s list that
    ``snap`` did not see: the queue's tail then, moved by the tasks queued ahead of it
    since (or that left the queue since); unknown for a queue not fully read."""
    tail = snap.tails.get(queue)
    if tail is None or tail.position is None:
        return UNKNOWN
    position = max(tail.position + index - snap.lengths.get(queue, 0), 0)
    if tail.eta is None:
        return Estimate(position)
    start = _start_at(snap, position)
    return Estimate(position, None if math.isinf(start) else start)


def _start_at(snap: Snapshot, place: int) -> float:
    """The estimated start of ``place`` of the pool's order (inf: unknown)."""
    if place < len(snap.starts):
        return snap.starts[place]
    beyond = place - len(snap.starts)
    return snap.after[min(beyond, len(snap.after) - 1)] if snap.after else math.inf


def material(old: Estimate, new: Estimate, now: float) -> bool:
    """Whether ``new`` is worth telling a client who was told ``old``: the ETA became
    known or unknown; or the position changed and the ETA moved by more than
    :data:`MIN_SHIFT_S` and :data:`SHIFT_SHARE` of the wait ``old`` left. With no ETA
    either way nothing is: every task behind a paid platform's cap moves up at each start,
    and its client would hear of each."""
    if (old.eta is None) != (new.eta is None):
        return True
    if old.eta is None or new.eta is None or old.position == new.position:
        return False
    left = max(old.eta - now, 0.0)
    return abs(new.eta - old.eta) > max(MIN_SHIFT_S, SHIFT_SHARE * left)
