"""The operator's view: ``/dashboard`` (static files in ``aigcq/web``) and its admin API.

``GET /api/admin/events`` streams a snapshot every second as Server-Sent Events (bridges,
queues, internal / external split, health, recent tasks, overflow spend (this process's
counters), spend today and this month (fleet-wide, :mod:`aigcq.scheduler.spend`), the paid
accounts as the platform counts them and as we do (:mod:`aigcq.scheduler.accounts`), the
budgets with what they spent (:mod:`aigcq.scheduler.budgets`), model-asynch — see
:mod:`aigcq.serve.admin_panels`); drain / undrain a bridge and retry a failed or cancelled
task; the incident controls (:mod:`aigcq.serve.admin_controls`).
Every data call needs the admin token as a Bearer token.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Header, Query
from fastapi.responses import Response, StreamingResponse

from aigcq.bridges.registry import record_instances
from aigcq.config import ProjectShare
from aigcq.domain import ErrorCode, Task, TaskState
from aigcq.gateway.errors import ClientError, error_responses
from aigcq.gateway.gateway import Gateway
from aigcq.gateway.http_api import require_admin
from aigcq.gateway.queue_view import internal_capacity, queue_rows
from aigcq.plumbing.background import one_round
from aigcq.scheduler.pauses import PauseKind, Pauses
from aigcq.serve.admin_controls import checked, control_routes
from aigcq.serve.admin_panels import AsynchPanel, overflow_spend
from aigcq.serve.admin_trends import Split, Trends
from aigcq.serve.by_filter import not_retried
from aigcq.serve.holding import add_holds
from aigcq.serve.live_tasks import PAGE_MAX, LiveFilter, live_page

if TYPE_CHECKING:
    from aigcq.serve.parts import ServeParts

log = logging.getLogger(__name__)

Authorization = Annotated[str | None, Header()]
RECENT_TASKS = 50  # the page filters them by state, client, platform and target
STATIC = {
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "chart.js": "text/javascript; charset=utf-8",
}


class Monitor:
    """Builds a snapshot every second and keeps the split of finished tasks."""

    def __init__(self, service: ServeParts, interval_s: float = 1.0) -> None:
        self.service = service
        self.interval_s = interval_s
        self.split = Split()
        self.health_history: deque[dict[str, Any]] = deque(maxlen=20)
        self.latest: dict[str, Any] | None = None
        self._finished: dict[str, int] | None = None  # per-target counts at the last sample
        self._tick = asyncio.Condition()
        settings = service.rt.settings
        self.asynch = AsynchPanel(settings.asynch_url, settings.admin_token)
        self.trends = Trends()
        self.pauses = Pauses(service.rt)

    async def run(self) -> None:
        try:
            while True:
                with one_round(log, "dashboard snapshot failed"):
                    await self.sample()
                await asyncio.sleep(self.interval_s)
        finally:
            await self.asynch.aclose()

    async def sample(self) -> dict[str, Any]:
        """Count newly finished tasks, build a snapshot and wake the event streams."""
        await self._count_finished()
        snapshot = await self.snapshot()
        async with self._tick:
            self.latest = snapshot
            self._tick.notify_all()
        return snapshot

    async def next(self, after: dict[str, Any] | None) -> dict[str, Any]:
        """The first snapshot newer than ``after``."""
        async with self._tick:
            await self._tick.wait_for(lambda: self.latest is not None and self.latest is not after)
            assert self.latest is not None
            return self.latest

    def _external(self, target: str) -> bool:
        return target in self.service.rt.platforms.adapters

    async def _count_finished(self) -> None:
        """This second's internal / external split, from the fleet-wide per-target counts
        that ``finish`` keeps (one read, whatever the rate)."""
        store = self.service.rt.store
        raw = await store.redis.hgetall(store.keys.finished)
        counts = {str(target): int(n) for target, n in raw.items()}
        # Tasks that finished before this process started are not charted.
        last, self._finished = self._finished, counts
        new = {t: n - last.get(t, 0) for t, n in counts.items()} if last is not None else {}
        external = sum(n for t, n in new.items() if self._external(t))
        internal = sum(n for t, n in new.items() if t) - external  # "": ended before dispatch
        self.split.add(time.time(), internal, external)

    async def snapshot(self, *, sample: bool = True) -> dict[str, Any]:
        """The state now; ``sample``: also take it as the trends' sample (the loop's, once a
        second; a request's snapshot reads them without adding one)."""
        rt = self.service.rt
        internal = internal_capacity(self.service.hub)
        queues = await queue_rows(rt, internal)
        overflow = overflow_spend(rt.settings.overflow_price)
        if sample:
            await self.trends.sample(rt.store, queues, overflow)
        spend = await self._spend()
        pauses = await self.pauses.all()
        add_holds(rt, queues, pauses, internal.serves if internal else ())
        return {
            "time": time.time(),
            "bridges": await self._bridges(),
            "queues": queues,
            "split": self.split.view(),
            "trends": self.trends.view(),
            "health": self._health(),
            "recent": [task_row(t) for t in await rt.store.reads.recent(RECENT_TASKS)],
            "overflow": overflow,
            "spend": spend,
            "asynch": await self.asynch.read(),
            "pauses": [p.view() for p in pauses],
            "accounts": await self.service.reconciler.view(),
            "budgets": await self.service.paid.budgets.view(spend),
            "shares": share_rows(rt.config.shares, queues, self._internal_name()),
            "capacity": self.service.capacity.view() if self.service.capacity.pools else None,
        }

    def _internal_name(self) -> str:
        """The internal target's name (its in-flight counts in the queue rows)."""
        internal = self.service.internal
        return internal.name if internal is not None else ""

    async def _spend(self) -> dict[str, Any]:
        """What paid tasks cost today and this month (UTC), fleet-wide, from Redis."""
        ledger = self.service.lifecycle.spend
        return {"day": await ledger.view("day"), "month": await ledger.view("month")}

    async def _bridges(self) -> list[dict[str, Any]]:
        """Bridges connected here, plus those other processes (or the past) recorded."""
        hub = self.service.hub
        now_mono, now = time.monotonic(), time.time()
        rows: dict[str, dict[str, Any]] = {}
        redis, keys = self.service.rt.redis, self.service.rt.store.keys
        async for key in redis.scan_iter(match=keys.bridge("*"), count=200, _type="hash"):
            if keys.is_bridge_tasks(str(key)):
                continue
            h = {str(k): str(v) for k, v in (await redis.hgetall(key)).items()}
            if h.get("bridgeId"):
                rows[h["bridgeId"]] = bridge_row_from_hash(h)
        for conn in hub.registry.bridges.values() if hub else []:
            rows[conn.bridge_id] = {
                "bridgeId": conn.bridge_id,
                "online": conn.online,
                "instances": conn.instance_count,
                "free": conn.free(),
                "running": sorted(conn.running),
                "pending": sorted(conn.pending),
                "lastHeartbeat": now - (now_mono - conn.last_seen),
                "failures": conn.failures,
                "inRotation": conn.online and conn.quarantined_at is None,
                "drained": conn.drained,
                "instanceStates": conn.instance_states,
                "local": True,
            }
        return sorted(without_replaced(rows.values()), key=lambda r: str(r["bridgeId"]))

    def _health(self) -> dict[str, Any] | None:
        hub = self.service.hub
        if hub is None:
            return None
        h = hub.health.health
        last = self.health_history[-1]["state"] if self.health_history else None
        if last != h.state.value:
            self.health_history.append(
                {"t": time.time(), "state": h.state.value, "reason": h.reason}
            )
        return {
            "state": h.state.value,
            "reason": h.reason,
            "passes": h.passes,
            "degradeCount": h.degrades,
            "recoverCount": h.recovers,
            "freeSlots": hub.free_slots(),
            "history": list(self.health_history),
        }


def bridge_row_from_hash(h: dict[str, str]) -> dict[str, Any]:
    """A bridge as another process (or an earlier connection) published it."""
    return {
        "bridgeId": h["bridgeId"],
        "online": h.get("online") == "1",
        "instances": int(h.get("instanceCount") or 0),
        "free": int(h.get("availableInstanceCount") or 0),
        "running": [],
        "pending": [],
        "lastHeartbeat": float(h.get("lastSeen") or 0),
        "failures": 0,
        "inRotation": h.get("online") == "1" and h.get("inRotation", "1") == "1",
        "drained": h.get("drained") == "1",
        "instanceStates": record_instances(h.get("instances")),
        "local": False,
    }


def without_replaced(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bridges but those replaced: an offline one whose instances an online one now
    describes (the bridge restarted under a new id on the same machine). One that left
    and was not replaced stays, offline, until its record expires (``KNOWN_FOR_S``)."""
    rows = list(rows)
    live = {i.get("instanceId") for r in rows if r["online"] for i in r["instanceStates"]}

    def replaced(row: dict[str, Any]) -> bool:
        ids = {i.get("instanceId") for i in row["instanceStates"]}
        return not row["online"] and bool(ids) and ids <= live

    return [r for r in rows if not replaced(r)]


def task_row(t: Task) -> dict[str, Any]:
    return {
        "taskId": t.task_id,
        "state": t.state.value,
        "AIGC": t.aigc,
        "platform": t.platform,
        "backendId": t.backend_id,
        "target": t.target,
        "attempt": t.attempt,
        "seconds": round(t.updated_at - t.created_at, 3),
        "updated": t.updated_at,
        "failure": t.failure,  # why it failed: class, code and message
    }


def admin_router(service: ServeParts, monitor: Monitor) -> APIRouter:
    """The dashboard and its API, showing what ``monitor`` samples (its loop runs with
    the process's)."""
    router = APIRouter(tags=["admin"])
    _dashboard_routes(router, service.gateway, monitor)
    _control_routes(router, service)
    control_routes(router, service)
    return router


def _dashboard_routes(router: APIRouter, gw: Gateway, monitor: Monitor) -> None:
    @router.get("/dashboard", include_in_schema=False)
    async def dashboard() -> Response:
        return static_file("dashboard.html")

    @router.get("/dashboard/{name}", include_in_schema=False)
    async def dashboard_asset(name: str) -> Response:
        return static_file(name)

    @router.get(
        "/api/admin/snapshot",
        summary="One dashboard snapshot",
        responses=error_responses(ErrorCode.AUTH),
    )
    async def snapshot(authorization: Authorization = None) -> dict[str, Any]:
        require_admin(gw, authorization)
        return await monitor.snapshot(sample=False)  # now, not the last second's sample

    @router.get(
        "/api/admin/accounts",
        summary="Paid accounts as their platform counts them and as we do; budgets",
        responses=error_responses(ErrorCode.AUTH),
    )
    async def accounts(authorization: Authorization = None) -> dict[str, Any]:
        require_admin(gw, authorization)
        service = monitor.service
        return {
            "accounts": await service.reconciler.view(),
            "budgets": await service.paid.budgets.view(),
        }

    @router.get(
        "/api/admin/live-tasks",
        summary="Tasks waiting and running now, where and for how long, a page at a time",
        responses=error_responses(ErrorCode.JSON, ErrorCode.AUTH),
    )
    async def live_tasks(
        state: Literal["pending", "dispatching", "running"] | None = None,
        project: str = "",
        platform: str = "",
        target: str = "",
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 50,
        authorization: Authorization = None,
    ) -> dict[str, Any]:
        require_admin(gw, authorization)
        wanted = LiveFilter(TaskState(state) if state else None, project, platform, target)
        return await live_page(gw.rt, wanted, offset, limit)

    @router.get(
        "/api/admin/events",
        summary="Dashboard snapshots as Server-Sent Events",
        responses=error_responses(ErrorCode.AUTH),
    )
    async def events(authorization: Authorization = None) -> StreamingResponse:
        require_admin(gw, authorization)
        return StreamingResponse(
            sse(monitor),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )


def _control_routes(router: APIRouter, service: ServeParts) -> None:
    """An operator's controls: drain a bridge, retry a task."""
    gw = service.gateway

    def drain_route(drained: bool) -> Callable[..., Awaitable[dict[str, Any]]]:
        """The handler that sets a bridge's drained flag to ``drained``."""

        async def route(
            bridge_id: str, ahead: bool = True, authorization: Authorization = None
        ) -> dict[str, Any]:
            require_admin(gw, authorization)
            return await set_drained(service, bridge_id, drained, ahead=ahead)

        return route

    for action, drained, summary in (
        ("drain", True, "No new tasks for a bridge"),
        ("undrain", False, "Assign to a bridge again"),
    ):
        router.add_api_route(
            f"/api/admin/bridges/{{bridge_id}}/{action}",
            drain_route(drained),
            methods=["POST"],
            name=action,
            summary=summary,
            responses=error_responses(
                ErrorCode.AUTH, ErrorCode.NOT_FOUND, ErrorCode.BRIDGE_NOT_FOUND, ErrorCode.CONTROL
            ),
        )

    @router.post(
        "/api/admin/tasks/{task_id}/retry",
        summary="Queue a failed task again (or deliver the paid result it already has)",
        responses=error_responses(ErrorCode.AUTH, ErrorCode.NOT_FOUND, ErrorCode.NOT_RETRYABLE),
    )
    async def retry(task_id: str, authorization: Authorization = None) -> dict[str, Any]:
        require_admin(gw, authorization)
        done = await service.lifecycle.retried_by_operator(task_id)
        if done.state is None:
            raise ClientError(ErrorCode.NOT_FOUND, "no such task", task_id)
        if not done.applied:
            raise ClientError(ErrorCode.NOT_RETRYABLE, not_retried(done), task_id)
        return {"taskId": task_id, "state": done.state.value}


async def set_drained(
    service: ServeParts, bridge_id: str, drained: bool, *, ahead: bool = True
) -> dict[str, Any]:
    """Drain (or undrain) a bridge on every process, kept in Redis (a bridge pause): here
    at once, elsewhere from their next dispatch round, which this starts; ahead of its
    connecting too. ``known``: it has connected here or to another process; ``ahead=False``
    refuses a bridge that never connected (a mistyped id), changing nothing."""
    hub = service.hub
    if hub is None:
        raise ClientError(ErrorCode.NOT_FOUND, "this process has no bridge hub")
    pauses = Pauses(service.rt)
    bridge_id = checked(pauses, PauseKind.BRIDGE, bridge_id)
    keys = service.rt.store.keys
    known = bridge_id in hub.registry.bridges or bool(
        await service.rt.redis.exists(keys.bridge(bridge_id))
    )
    if not known and not ahead:
        raise ClientError(ErrorCode.BRIDGE_NOT_FOUND, f"no bridge {bridge_id!r} ever connected")
    await pauses.set(PauseKind.BRIDGE, bridge_id, drained)
    connected = await hub.drain(bridge_id, drained)
    return {"bridgeId": bridge_id, "drained": drained, "connected": connected, "known": known}


async def sse(monitor: Monitor) -> AsyncIterator[bytes]:
    """Each new snapshot as one ``data:`` event, starting with the current one."""
    snapshot = monitor.latest or await monitor.next(None)
    while True:
        yield b"data: " + orjson.dumps(snapshot) + b"\n\n"
        snapshot = await monitor.next(snapshot)


def static_file(name: str) -> Response:
    if name not in STATIC:
        raise ClientError(ErrorCode.NOT_FOUND, f"no file {name!r}")
    body = (resources.files("aigcq.web") / name).read_bytes()
    return Response(body, media_type=STATIC[name], headers={"Cache-Control": "no-cache"})


def share_rows(
    shares: Mapping[str, ProjectShare], queues: list[dict[str, Any]], internal: str
) -> list[dict[str, Any]]:
    """Each project's share of our GPUs (model.json ``share``) beside what it runs on them
    now: its queues' tasks in flight on the ``internal`` target."""
    running: dict[str, int] = {}
    for q in queues:
        running[q["AIGC"]] = running.get(q["AIGC"], 0) + q["inFlight"].get(internal, 0)
    return [
        {"AIGC": name, "min": share.min, "max": share.max, "weight": share.weight,
         "running": running.get(name, 0)}
        for name, share in sorted(shares.items())
    ]  # fmt: skip
