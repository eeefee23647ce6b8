"""The routing decision (seed 000 §3.6): a pure function of backlog and capacities.

backlog ≤ internal capacity   -> everything internal;
otherwise                     -> internal first, overflow to the external platform up to its
                                 capacity, the rest keeps waiting.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Plan:
    internal: int
    external: int
    waiting: int


def plan(
    backlog: int, internal_capacity: int, external_capacity: int, internal_elsewhere: int = 0
) -> Plan:
    """``internal_elsewhere``: free internal slots held by other processes (bridges are
    connected to one process each). Internal capacity is theirs plus ours; what they can
    take waits for them rather than overflow to a paid platform."""
    backlog = max(backlog, 0)
    internal = min(backlog, max(internal_capacity, 0))
    for_others = min(backlog - internal, max(internal_elsewhere, 0))
    external = min(backlog - internal - for_others, max(external_capacity, 0))
    return Plan(internal, external, backlog - internal - external)


def overflow_ready(waited_s: Iterable[float], after_s: float) -> int:
    """How many tasks at the head of the line (``waited_s`` in queue order) may overflow:
    those that have waited ``after_s`` or longer, up to the first that has not."""
    ready = 0
    for waited in waited_s:
        if waited < after_s:
            break
        ready += 1
    return ready


def share_round_robin(demands: list[int], capacity: int, start: int = 0) -> list[int]:
    """Split ``capacity`` over queues with ``demands`` one slot at a time, from ``start``.

    Queues sharing one pool (AIGC projects on the same platform) each get a fair share;
    a queue never gets more than it asks for, and no slot is left unused while any queue
    still has demand.
    """
    shares = [0] * len(demands)
    remaining = min(max(capacity, 0), sum(max(d, 0) for d in demands))
    n = len(demands)
    i = start % n if n else 0
    while remaining > 0:
        if shares[i] < demands[i]:
            shares[i] += 1
            remaining -= 1
        i = (i + 1) % n
    return shares


def may_overflow(waited_s: float, after_s: float) -> bool:
    """Whether a task an internal target handed back, having waited ``waited_s`` since its
    submit, may go to a paid platform now (``after_s`` ≤ 0: at once)."""
    return after_s <= 0 or waited_s >= after_s


def capped(capacity: int, cap: int) -> int:
    """``capacity`` limited to ``cap`` (seed 000 §3.7 ``*_CAPACITY_MAX``; 0 = no cap): the
    internal free slots one round considers, a queue's external tasks in flight."""
    return min(capacity, cap) if cap > 0 else capacity
