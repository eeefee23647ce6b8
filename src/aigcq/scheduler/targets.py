"""Where tasks run, as the dispatch loop sees it: one protocol, three peers.

A *target* runs claimed tasks: our bridges (:class:`aigcq.bridges.hub.BridgeHub`), a
message-dispatcher in front of other bridges (:mod:`aigcq.mdclient.target`), or the paid
platforms (:class:`aigcq.scheduler.paid.PaidPlatforms`). Each offers capacity, takes over
claimed tasks (:meth:`Target.hand_over`), hands back those it could not place, and hears
of every task's end (:meth:`Target.task_ended`: free the slot, stop what is unwanted).
What a target's answers do to a task is the lifecycle's (:mod:`aigcq.scheduler.lifecycle`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from aigcq.health import Health
from aigcq.queue.store import Claimed
from aigcq.runtime import Runtime
from aigcq.scheduler.ends import TaskEnd
from aigcq.scheduler.lifecycle import Lifecycle


class Unrunnable(NamedTuple):
    """Why nobody can run a handed-back task: it fails with this, not waits (``detail``:
    text, or a dict whose ``class`` says whose fault it is)."""

    code: str
    message: str
    detail: str | dict[str, Any]


@dataclass(frozen=True, slots=True)
class HandBack:
    """A claimed task a target could not place. It goes to the queue's paid platform in
    the same attempt once it has waited ``overflow_after_s`` since its submit (and one
    has room); otherwise it waits again after ``wait_s``, or fails with ``unrunnable``."""

    task: Claimed
    reason: str
    overflow_after_s: float
    wait_s: float = 0.0
    unrunnable: Unrunnable | None = None


class Chosen(NamedTuple):
    """The waiting tasks an internal target takes from the head of a queue (see
    :meth:`InternalTarget.choose`)."""

    ids: list[str]
    #: when a task it left waiting is due (its wait for a capable instance, or for the
    #: paid platform, is over): ask again then
    wake_in_s: float | None = None


class Target(Protocol):
    name: str

    async def hand_over(self, aigc: str, platform: str, tasks: list[Claimed]) -> list[HandBack]:
        """Send claimed tasks on; the ones this target could not place."""
        ...

    def task_ended(self, task_id: str, target: str, end: TaskEnd, attempt: int | None) -> None:
        """A task ended (see :class:`TaskEnd`): free what it held here, stop what is no
        longer wanted. Called for every task's end, whichever target ran it."""
        ...


class InternalTarget(Target, Protocol):
    """Our own GPUs (bridges, or a message-dispatcher's): capacity shared by the queues
    of the platforms it ``serves``."""

    serves: tuple[str, ...]
    #: used before paid platforms (seed 000's rule); False: after them, for what they
    #: have no room for
    preferred: bool

    @property
    def healthy(self) -> bool: ...

    @property
    def health_view(self) -> Health:
        """This process's health state machine for the target (for metrics)."""
        ...

    def free_slots(self) -> int: ...

    def free_elsewhere(self) -> int:
        """Free slots of this target that other aigcq processes hold (0 when every
        process sees the same capacity, as through a message-dispatcher)."""
        ...

    async def fresh_elsewhere(self) -> int:
        """:meth:`free_elsewhere`, read again now: asked before a round pays for a task
        that such a slot could run."""
        ...

    async def choose(
        self,
        aigc: str,
        platform: str,
        n: int,
        *,
        paid_free: int | None,
        among: Sequence[str] | None = None,
    ) -> Chosen | None:
        """The waiting tasks of the queue to claim for it now, by id: FIFO within what
        its free capacity can run, at most ``n`` placed, skipping (a bounded number of)
        tasks none of it can run now; and those to hand back at once (to the queue's paid
        platform, which has room for ``paid_free`` more (None: none serves the queue), or
        to fail). ``None``: it can run any task, claim ``n`` from the head. ``among``:
        only of these waiting tasks, in this order (the dispatch loop passes over the
        tasks of paused workflows)."""
        ...

    async def run(self) -> None:
        """What keeps its capacity and health known, while the process serves."""
        ...


#: builds a process's internal target other than its own bridge hub
InternalTargetBuilder = Callable[[Runtime, Lifecycle], InternalTarget]
