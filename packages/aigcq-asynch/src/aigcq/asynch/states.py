"""Task states (``asynch_task.state``)."""

from __future__ import annotations

from enum import IntEnum


class State(IntEnum):
    QUEUED = 0
    RUNNING = 1
    SUCCEEDED = 2
    FAILED = 3
    DOWNLOADED = 4


LIVE = (State.QUEUED, State.RUNNING)
