"""What every process knows of a bridge: its shared record, read back when it registers.

A bridge connects to one aigcq process, and may register with another at any time (its
process restarted, a load balancer moved it, a seed bridge started again with a new uuid).
So what decides whether its capacity is usable at once is not kept per process but in the
bridge's record ``{prefix}:bridge:{bridgeId}`` (written by
:class:`~aigcq.bridges.registry.BridgeRegistry`): which process holds it (``process``),
how and when it left (``left``: ``closed``, its socket closed, or ``silent``, it missed
its heartbeats; ``leftAt``, epoch seconds), and since when it is out of rotation
(``quarantinedAt``, epoch seconds), with its shared failure count. The record is kept
:data:`KNOWN_FOR_S` after the bridge's last word.

:class:`Standing` is that record read back, with the rule (no I/O): a bridge that did not
go silent and is not out of rotation is *fresh*, its capacity used at once (see
:meth:`aigcq.health.Health.observe`); one out of rotation stays out, its cool-down counted
from when it went out, wherever that was.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

#: how a bridge left: its socket closed (a blip, a restart, a move), or it went silent
CLOSED, SILENT = "closed", "silent"
#: how long a bridge's record outlives its last word (a bridge back within it is known)
KNOWN_FOR_S = 600


@dataclass(frozen=True, slots=True)
class Standing:
    """A bridge as the cluster last recorded it (all defaults: never seen, or forgotten)."""

    known: bool = False
    #: a process holds it (or held it when that process stopped writing)
    online: bool = False
    process: str = ""
    left: str = ""  # CLOSED, SILENT, or "" (it has not left)
    left_at: float | None = None
    quarantined_at: float | None = None
    failures: int = 0

    @classmethod
    def of(cls, record: Mapping[str, str]) -> Standing:
        """From the record's fields (``{}``: not known); a field it lacks or cannot read
        counts as unset."""
        if not record:
            return cls()
        return cls(
            known=True,
            online=record.get("online") == "1",
            process=record.get("process", ""),
            left=record.get("left", ""),
            left_at=_number(record.get("leftAt")),
            quarantined_at=_number(record.get("quarantinedAt")),
            failures=int(_number(record.get("failures")) or 0),
        )

    def out_since(self) -> float | None:
        """When it went out of rotation, on this process's ``time.monotonic()`` clock (for
        its cool-down); ``None`` while in rotation."""
        if self.quarantined_at is None:
            return None
        return time.monotonic() - max(0.0, time.time() - self.quarantined_at)

    @property
    def fresh(self) -> bool:
        """Whether its capacity is usable at once: nothing about it failed lately (it is
        new, back after its socket closed, or moved from another process), i.e. it did
        not go silent and is not out of rotation."""
        return self.left != SILENT and self.quarantined_at is None

    def describe(self, process: str) -> str:
        """For the REGISTER log line, ``process`` being the one it registers with."""
        if not self.known:
            return "new"
        if self.quarantined_at is not None:
            return "known, out of rotation"
        if self.left == SILENT:
            return "known, back after going silent"
        return "known, moved here" if self.process not in ("", process) else "known, back"


def _number(raw: str | None) -> float | None:
    """A field's number (epoch seconds, a count); ``None`` when unset or unreadable."""
    try:
        return float(raw) if raw else None
    except ValueError:
        return None
