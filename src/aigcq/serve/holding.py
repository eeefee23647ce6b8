"""What holds a queue's waiting work, next to the queue in the admin snapshot (``heldBy``),
``aigcq status`` and the dashboard: a paused project, a paused paid account (or one with
the same key), an automatic hold (a budget or balance floor reached, drift), a paused
workflow (its tasks), drained bridges (the queues our GPUs serve)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from aigcq.runtime import Runtime
from aigcq.scheduler.pauses import Pause, Paused, PauseKind


def add_holds(
    rt: Runtime, queues: Iterable[dict[str, Any]], pauses: list[Pause], internal: Collection[str]
) -> None:
    """Each queue row's ``heldBy``: what holds its work, one line each (empty: nothing);
    ``internal``: the platforms our GPUs serve."""
    for row in queues:
        row["heldBy"] = holds(rt, row["AIGC"], row["platform"], pauses, internal)


def holds(
    rt: Runtime, aigc: str, platform: str, pauses: list[Pause], internal: Collection[str]
) -> list[str]:
    """What holds queue ``aigc`` / ``platform``, as :func:`line` says each."""
    adapter = rt.platforms.adapter_for(platform)
    target = adapter.name if adapter is not None and adapter.paid else ""
    found = []
    for pause in pauses:
        if _holds(rt, pause, aigc, platform, target, platform in internal):
            found.append(line(pause))
    return found


def _holds(rt: Runtime, pause: Pause, aigc: str, platform: str, target: str, ours: bool) -> bool:
    match pause.kind:
        case PauseKind.PROJECT:
            return pause.name == aigc
        case PauseKind.ACCOUNT | PauseKind.HOLD:
            return bool(target) and Paused.of([pause]).account(rt, aigc, platform, target)
        case PauseKind.BRIDGE:
            return ours
        case PauseKind.WORKFLOW:
            return True  # its tasks, in whichever queue
    return False


def line(pause: Pause) -> str:
    """``project proj paused (deploy)``, ``bridge br1 drained``, ``budget hold
    proj/runninghub``, ``workflow w1 paused: its tasks``."""
    note = f" ({pause.note})" if pause.note else ""
    match pause.kind:
        case PauseKind.BRIDGE:
            return f"bridge {pause.name} drained{note}"
        case PauseKind.HOLD:
            cause, _, held = pause.name.partition(":")
            return f"{cause} hold {held}{note}"
        case PauseKind.WORKFLOW:
            return f"workflow {pause.name} paused: its tasks{note}"
    return f"{pause.kind} {pause.name} paused{note}"
