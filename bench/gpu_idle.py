"""Did our GPUs stay busy before anything was paid? Two figures of a run (issue 24):

- ``paid_while_free``: paid creates made while an instance that could run the task had
  been idle and usable for more than ``free_for`` seconds (200 ms);
- ``gpu_idle_s``: GPU-seconds an usable instance sat idle while a task it could run was
  waiting, beyond ``grace`` seconds (1 s) in each gap.

From what the run recorded: when each instance ran prompts (the ComfyUI emulator's
``busySpans``), when it could not be used (its bridge or serve killed, Redis down: the
fault windows), how many tasks it could run waited (samples of the wait list, per
instance: an instance lacking a node class cannot run every task), and for each paid
create the instances that could have run its task. Times are wall-clock seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

Span = tuple[float, float]


def merged(spans: list[Span]) -> list[Span]:
    """``spans`` sorted, overlapping ones joined."""
    out: list[Span] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        elif end > start:
            out.append((start, end))
    return out


def complement(spans: list[Span], start: float, end: float) -> list[Span]:
    """The parts of ``[start, end]`` that no span covers."""
    out: list[Span] = []
    at = start
    for s, e in merged(spans):
        if s > at:
            out.append((at, min(s, end)))
        at = max(at, e)
        if at >= end:
            break
    if at < end:
        out.append((at, end))
    return [(s, e) for s, e in out if e > s]


def intersect(a: list[Span], b: list[Span]) -> list[Span]:
    """Where both (each sorted and disjoint) cover."""
    out: list[Span] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def waiting_spans(samples: list[tuple[float, int]]) -> list[Span]:
    """From samples (time, tasks waiting): when at least one task waited, each sample
    holding until the next."""
    ordered = sorted(samples)
    spans = [(t, nxt) for (t, n), (nxt, _) in pairwise(ordered) if n > 0]
    return merged(spans)


@dataclass
class Timeline:
    start: float
    end: float
    #: instance -> when it ran a prompt
    busy: dict[str, list[Span]] = field(default_factory=dict)
    #: instance -> when it could not be used (faults, start-up)
    out: dict[str, list[Span]] = field(default_factory=dict)
    #: instance -> (time, tasks waiting to be dispatched that it could run)
    waiting: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    def idle(self, instance: str) -> list[Span]:
        """When the instance was usable and ran nothing."""
        usable = complement(self.out.get(instance, []), self.start, self.end)
        return intersect(complement(self.busy.get(instance, []), self.start, self.end), usable)


def gpu_idle_s(timeline: Timeline, grace: float = 1.0) -> float:
    """Seconds usable instances were idle while a task they could run waited, beyond
    ``grace`` a gap."""
    total = 0.0
    for instance in timeline.busy:
        waited = waiting_spans(timeline.waiting.get(instance, []))
        for start, end in intersect(timeline.idle(instance), waited):
            total += max(0.0, end - start - grace)
    return round(total, 3)


#: a paid create: when, and the instances that could have run its task
Create = tuple[float, frozenset[str]]


#: the longest-idle usable instance that could run a create's task then: (instance, idle s)
Free = tuple[str, float]


def longest_idle(timeline: Timeline, creates: list[Create]) -> list[Free | None]:
    """For each create, the usable instance that could run its task and had been idle
    longest then, and for how long (None: none was idle)."""
    idle = {instance: timeline.idle(instance) for instance in timeline.busy}
    return [
        max(
            (
                (instance, at - start)
                for instance in capable
                for start, end in idle.get(instance, [])
                if start < at <= end
            ),
            key=lambda free: free[1],
            default=None,
        )
        for at, capable in creates
    ]


def free_at_creates(timeline: Timeline, creates: list[Create]) -> list[float]:
    """For each create, how long the longest-idle usable instance that could run its task
    had been idle then (0.0: none was)."""
    return [free[1] if free else 0.0 for free in longest_idle(timeline, creates)]


def paid_while_free(timeline: Timeline, creates: list[Create], free_for: float = 0.2) -> int:
    """Creates made while a usable instance that could run the task had been idle for more
    than ``free_for``."""
    return sum(1 for free in free_at_creates(timeline, creates) if free > free_for)
