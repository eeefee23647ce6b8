"""Internal-capacity health (seed 000 §8): healthy / degraded / recovering.

A failed check degrades once ``failure_threshold`` checks in a row have failed (default 1:
at once; seed 000 §3.7 ``healthCheck.failureThreshold``); a failure observed as
``immediate`` (a submit error or timeout, §3.4) and any failure while not healthy degrade at
once. Recovery needs ``recover_passes`` consecutive passing checks (seed: 3, i.e. 30 s at
the 10 s interval). While not healthy an internal target offers no capacity, so new tasks
overflow to the external platform.

The stability period guards against capacity that failed and may fail again. Capacity that
has not failed is used at once, so owned GPUs are not left idle for 30 s while paid calls are
made: the first passing check ever (the first bridge of a process started before its GPUs,
say), and a pass that a bridge in good standing brought (``fresh``: a new bridge, one back
after its socket closed, one that moved from another process; not one that went silent or
is out of rotation, see :mod:`aigcq.bridges.known`), whatever the failure was. What a check
is belongs to the target: the bridges' is :mod:`aigcq.bridges.health_monitor`, the
message-dispatcher's its ``/api/health``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

#: the bridges' check when none is connected
NO_BRIDGE = "no bridge connected"


class HealthState(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    RECOVERING = "recovering"


@dataclass(slots=True)
class Health:
    """The pure state machine: feed it check results, read ``state``."""

    recover_passes: int = 3
    failure_threshold: int = 1
    state: HealthState = HealthState.HEALTHY
    reason: str = ""
    passes: int = 0
    #: consecutive failed checks
    failures: int = 0
    degrades: int = 0
    recovers: int = 0
    #: a check has passed at least once
    proven: bool = False

    @property
    def healthy(self) -> bool:
        return self.state is HealthState.HEALTHY

    def observe(
        self, reason: str, *, immediate: bool = False, fresh: bool = False
    ) -> HealthState | None:
        """Record one check (``reason`` empty = passed); the new state if it changed.
        A failure below ``failure_threshold`` (and not ``immediate``) leaves a healthy
        state as it is. ``fresh``: a pass that capacity which has not failed brought (a
        bridge in good standing registered): it restores health at once."""
        before = self.state
        self.failures = self.failures + 1 if reason else 0
        healthy_yet = before is HealthState.HEALTHY and self.failures < self.failure_threshold
        if reason and healthy_yet and not immediate:
            return None
        if reason:
            self.state, self.reason, self.passes = HealthState.DEGRADED, reason, 0
            if before is HealthState.HEALTHY:
                self.degrades += 1
        elif before is not HealthState.HEALTHY:
            self.passes += 1
            if self.passes >= self.recover_passes or not self.proven or fresh:
                self.state, self.reason, self.passes = HealthState.HEALTHY, "", 0
                self.recovers += 1
            else:
                self.state = HealthState.RECOVERING
        self.proven = self.proven or not reason
        return self.state if self.state is not before else None
