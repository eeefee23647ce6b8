"""``aigcq status``, ``aigcq tasks show`` and ``aigcq tasks list``: the server's state as
terminal tables."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Group
from rich.table import Column, Table
from rich.text import Text

from aigcq.client.types import AigcqError

if TYPE_CHECKING:
    from aigcq.cli.http_api import Api


def fetch_snapshot(server: Api, limit: int) -> dict[str, Any]:
    """The admin snapshot (bridges, queues, health) or, for client tokens, queues only."""
    try:
        snap: dict[str, Any] = server.get("/api/admin/snapshot")
    except AigcqError as exc:
        if exc.code != "AuthError":
            raise
        return {
            "queues": server.get("/api/queues"),
            "recent": server.get("/api/tasks", limit=limit),
        }
    snap["recent"] = snap.get("recent", [])[:limit]
    return snap


def render(snap: dict[str, Any]) -> Group:
    parts: list[Table] = []
    if snap.get("health"):  # null from a server whose internal target is a dispatcher
        parts.append(_health(snap["health"]))
    if "bridges" in snap:
        parts.append(_bridges(snap["bridges"]))
    parts.append(_queues(snap["queues"]))
    if snap.get("accounts"):
        parts.append(_accounts(snap["accounts"]))
    budgets = snap.get("budgets") or {}
    if budgets.get("projects") or budgets.get("accounts"):
        parts.append(_budgets(budgets))
    if (snap.get("capacity") or {}).get("pools"):
        parts.append(_pools(snap["capacity"]))
    parts.append(_recent(snap["recent"]))
    failed = [t for t in snap["recent"] if t.get("failure")]
    if failed:
        parts.append(_failures(failed))
    return Group(*parts)


def _health(h: dict[str, Any]) -> Table:
    table = Table("state", "reason", "free slots", "degraded", "recovered", title="internal")
    table.add_row(
        h["state"], h.get("reason") or "-", str(h["freeSlots"]),
        str(h["degradeCount"]), str(h["recoverCount"]),
    )  # fmt: skip
    return table


def _bridges(rows: list[dict[str, Any]]) -> Table:
    columns = ("bridge", "online", "instances", "free", "running", "heard", "instance states")
    table = Table(*columns, title="bridges")
    now = time.time()
    for b in rows:
        heard = f"{now - b['lastHeartbeat']:.0f} s ago" if b.get("lastHeartbeat") else "-"
        state = "drained" if b.get("drained") else "yes" if b["online"] else "no"
        table.add_row(
            b["bridgeId"], state, str(b["instances"]), str(b["free"]),
            str(len(b.get("running", []))), heard, _instance_states(b),
        )  # fmt: skip
    return table


def _instance_states(bridge: dict[str, Any]) -> str:
    """``host:8188 busy (NVIDIA L4, 18.2/22.5 GiB free), host:8189 offline`` (each instance
    as its bridge reported it, with its device and VRAM when known)."""
    states = bridge.get("instanceStates") or []
    return ", ".join(f"{i.get('instanceId')} {i.get('state')}{_device(i)}" for i in states) or "-"


def _device(instance: dict[str, Any]) -> str:
    """`` (NVIDIA L4, 18.2/22.5 GiB free)``; `` (cpu)`` without VRAM; ``""`` when unknown."""
    name, total = instance.get("device"), instance.get("vramTotal")
    if not name:
        return ""
    if not total:
        return f" ({name})"
    return f" ({name}, {_gib(instance.get('vramFree') or 0)}/{_gib(total)} GiB free)"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}"


def _queues(rows: list[dict[str, Any]]) -> Table:
    """Each queue; with the admin token, what holds its work (``heldBy``: pauses, holds,
    drains), next to it."""
    columns = ["AIGC", "platform", "waiting", "in flight", "capacity", "oldest wait"]
    held = any("heldBy" in q for q in rows)
    table = Table(*columns, *(["held by"] if held else []), title="queues")
    for q in rows:
        oldest = f"{q['oldestWaitS']:g} s" if q["waiting"] and "oldestWaitS" in q else "-"
        cells = [
            q["AIGC"], q["platform"], str(q["waiting"]), _per_target(q["inFlight"]),
            _per_target(q.get("capacity", {})), oldest,
        ]  # fmt: skip
        if held:
            cells.append(Text("; ".join(q.get("heldBy") or []) or "-", style="yellow"))
        table.add_row(*cells)
    return table


def _pools(view: dict[str, Any]) -> Table:
    """The capacity planner's last decision (pools.json): each pool's instances now and
    wanted, and why; the caption the projected spend of each choice over its horizon."""
    columns = ("pool", "current", "busy", "booting", "desired", "stopping", "reason")
    projected = view.get("projected") or {}
    spend = ", ".join(
        f"{name} {p['cost']:g} ({p['paidTasks']} paid, {p['misses']} late)"
        for name, p in projected.items()
    )
    horizon = f"projected over {view.get('horizonS', 0):g} s: {spend}" if spend else None
    table = Table(*columns, title="capacity (pools.json)", caption=horizon)
    for p in view["pools"]:
        table.add_row(
            p["pool"], str(p["current"]), str(p["busy"]), str(p["booting"]), str(p["desired"]),
            ", ".join(p.get("stop") or []) or "-", p.get("reason") or "-",
        )  # fmt: skip
    return table


def _accounts(rows: list[dict[str, Any]]) -> Table:
    """The paid accounts as the platform counts their tasks and as we do."""
    columns = ("account", "projects", "theirs", "ours", "drift", "coins", "polled", "suspects")
    table = Table(*columns, title="paid accounts (reconciled)")
    now = time.time()
    for a in rows:
        polled = f"{now - a['polledAt']:.0f} s ago" if a.get("polledAt") else "-"
        if a.get("error"):
            polled = f"{polled}; {a['error']} ({a.get('failures', 0)}x)"
        table.add_row(
            f"{a['target']}/{a['account']}", ", ".join(a["projects"]), _num(a["theirs"]),
            _num(a["ours"]), _num(a["drift"]), _num(a.get("remainCoins")), polled,
            ", ".join(s["taskId"] for s in a.get("suspects", [])) or "-",
        )  # fmt: skip
    return table


def _budgets(view: dict[str, Any]) -> Table:
    """Each spend limit with what its period spent, and whether it is reached."""
    table = Table("scope", "name", "today", "this month", "floor", title="budgets")
    for p in view.get("projects", []):
        table.add_row(
            "project", f"{p['AIGC']} ({p['onLimit']})", _spent(p["day"]), _spent(p["month"]), "-"
        )
    for a in view.get("accounts", []):
        floor = (
            "-"
            if a["balanceFloor"] is None
            else f"{_num(a['remainCoins'])} / {a['balanceFloor']:g}"
        )
        if a.get("floorReached"):
            floor += " REACHED"
        table.add_row(
            "account", f"{a['target']}/{a['account']}", _spent(a["day"]), _spent(a["month"]), floor
        )
    return table


def _spent(figure: dict[str, Any]) -> str:
    """``1.5 / 10`` (``REACHED`` at the limit); ``1.5`` without a limit."""
    if figure["limit"] is None:
        return f"{figure['spent']:g}"
    text = f"{figure['spent']:g} / {figure['limit']:g}"
    return f"{text} REACHED" if figure["reached"] else text


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _per_target(counts: dict[str, int]) -> str:
    """``bridge:1, runninghub:0``."""
    return ", ".join(f"{k}:{v}" for k, v in counts.items()) or "-"


#: a wide table's frame: no vertical rules, one space between columns, so the room goes
#: to whole ids and to the failures
LEAN: dict[str, Any] = {
    "box": box.SIMPLE_HEAD,
    "collapse_padding": True,
    "pad_edge": False,
    "show_edge": False,
}


def id_column(rows: list[dict[str, Any]]) -> Column:
    """The ``taskId`` column, as wide as its longest id and never wrapped: an id is never
    cut (``…``) nor split, so it pastes whole into ``aigcq tasks show``; the other columns
    give way."""
    widest = max((len(t["taskId"]) for t in rows), default=0)
    return Column("taskId", no_wrap=True, min_width=widest, overflow="ignore")


def _recent(rows: list[dict[str, Any]]) -> Table:
    table = Table(id_column(rows), "state", "AIGC", "platform", "target", "attempt", "seconds")
    table.title = "recent tasks"
    for t in rows:
        table.add_row(
            t["taskId"], t["state"], t["AIGC"], t["platform"], t["target"] or "-",
            str(t["attempt"]), str(t["seconds"]),
        )  # fmt: skip
    return table


def _failures(rows: list[dict[str, Any]]) -> Table:
    """The recent failures with why each failed: class, code and message."""
    columns = ("AIGC", "platform", "target", "failure")
    table = Table(id_column(rows), *columns, title="recent failures")
    for t in rows:
        why = Text(failure_text(t["failure"]))  # not markup: a message may hold [brackets]
        table.add_row(t["taskId"], t["AIGC"], t["platform"], t["target"] or "-", why)
    return table


def failure_text(failure: dict[str, Any]) -> str:
    """``PromptValidation (task): Value 4096 bigger than max`` (no class: ``code: message``)."""
    kind = f" ({failure['class']})" if failure.get("class") else ""
    return f"{failure['code'] or 'failed'}{kind}: {failure['message'] or '-'}"


def timeline(server: Api, task_id: str) -> Group:
    """The task's transitions as a table, and why it failed (when it did)."""
    task = server.get(f"/api/tasks/{task_id}")
    table = Table("time", "state", "target", "attempt", "note")
    table.title = f"task {task_id}: {task['state']} ({task['AIGC']} / {task['platform']})"
    for e in task["timeline"]:
        stamp = _clock(e["t"]) + f".{int(e['t'] % 1 * 1000):03d}"
        table.add_row(stamp, e["state"], e["target"] or "-", str(e["attempt"]), e["note"] or "")
    lines: list[Table | Text] = [table]
    if task["state"] == "pending":
        lines.append(Text(standing_text(task, time.time())))
    if task.get("failure"):
        lines.append(Text(f"failure: {failure_text(task['failure'])}", style="red"))
    if task.get("traceId"):
        lines.append(Text(f"trace: {task['traceId']}"))
    return Group(*lines)


def standing_text(task: dict[str, Any], now: float) -> str:
    """Where a waiting task stands: its ``position`` and ``etaStartMs`` (null: unknown)."""
    position, eta_ms = task.get("position"), task.get("etaStartMs")
    ahead = "unknown" if position is None else f"{position} ahead"
    if eta_ms is None:
        return f"position: {ahead}; expected start on our GPUs: unknown"
    eta = eta_ms / 1000
    return f"position: {ahead}; expected start {_clock(eta)} (in {max(eta - now, 0):.0f} s)"


def task_list(page: dict[str, Any], now: float) -> Table:
    """A page of ``GET /api/admin/tasks``: each task with where it runs (or ran), since when
    and for how long, and why it failed."""
    columns = ("state", "AIGC", "platform", "client", "target", "attempt", "submitted", "for")
    failure = Column("failure", overflow="fold")  # folded, never cut: read whole
    table = Table(id_column(page["tasks"]), *columns, failure, **LEAN)
    shown = len(page["tasks"])
    first = page["offset"] + 1 if shown else 0
    table.title = f"tasks {first}–{page['offset'] + shown} of {page['total']}"
    for t in page["tasks"]:
        live = t["state"] not in ("success", "failed", "cancelled")
        took = (now if live else t["updated"]) - t["created"]
        why = Text(failure_text(t["failure"])) if t.get("failure") else Text("")
        table.add_row(
            t["taskId"], t["state"], t["AIGC"], t["platform"], t["backendId"] or "-",
            t["target"] or "-", str(t["attempt"]), _when(t["created"], now), f"{took:.1f} s", why,
        )  # fmt: skip
    return table


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _when(t: float, now: float) -> str:
    """``14:05:09`` today, ``01-30 14:05`` another day (local time)."""
    same_day = time.localtime(t)[:3] == time.localtime(now)[:3]
    return _clock(t) if same_day else time.strftime("%m-%d %H:%M", time.localtime(t))
