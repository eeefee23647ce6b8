"""The capacity planner in a serve process (issue 40; docs/capacity.md).

Every ``AIGCQ_CAPACITY_INTERVAL_S`` each process reads the planner's inputs from Redis —
the waiting tasks of the queues our GPUs serve (the look-ahead window a dispatch round
reads: run-time means and start deadlines; the rest of each queue by its length), the
bridges of the fleet (their shared records: each instance idle or busy, drained or not),
when each was first seen (its billing position), how many instances each pool was asked
for and when (booting ones, with their ETA), and each paid account's room — and runs the
pure planner (:mod:`aigcq.scheduler.capacity`). Its last decision is what
``GET /api/capacity``, the KEDA endpoint and ``aigcq_desired_instances{pool}`` show.

One process of the fleet at a time (a short Redis lock) acts on it: it drains the bridges
chosen for scale-in (a bridge pause: no new task, on every process), undrains them if the
work comes back first, and runs ``AIGCQ_SCALE_COMMAND POOL DESIRED [BRIDGE_ID...]`` when a
pool's desired count changes or a drained bridge has become idle — a bridge is named to
the hook only once it holds no task. The decision is logged with its inputs.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hmac
import logging
import shlex
import statistics
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter

from aigcq.bridges.registry import record_instances
from aigcq.config import PoolConfig
from aigcq.domain import ErrorCode
from aigcq.gateway.errors import ClientError, error_responses
from aigcq.gateway.http_api import Authorization, require_admin
from aigcq.plumbing.auth import bearer
from aigcq.plumbing.background import every
from aigcq.plumbing.text import text
from aigcq.queue.store import Windowed
from aigcq.scheduler import capacity
from aigcq.scheduler.capacity import InstanceView, Job, PaidSpec, Plan, PoolSpec
from aigcq.scheduler.pauses import PauseKind, Pauses

if TYPE_CHECKING:
    from aigcq.serve.parts import ServeParts

log = logging.getLogger(__name__)

#: waiting tasks of each ready key read from the look-ahead window
WINDOW = 500
#: waiting tasks planned at most (those beyond the window by their queue's length)
JOBS_MAX = 5000
#: tasks in flight read per queue and target for the forecast's arrivals, at most
ARRIVALS_READ = 2000
#: a pool asked for instances that have not registered after this many boot times
#: stops counting them as booting
BOOT_PATIENCE = 3.0
HOOK_TIMEOUT_S = 60.0


def pool_specs(pools: Mapping[str, PoolConfig]) -> dict[str, PoolSpec]:
    return {
        name: PoolSpec(
            name,
            p.price_per_hour,
            p.step_s,
            p.boot_s,
            p.min,
            p.max,
            frozenset(p.node_classes) | frozenset(p.models),
        )
        for name, p in pools.items()
    }


def pool_of(bridge_id: str, pools: Mapping[str, PoolConfig]) -> str:
    """The pool whose ``bridges`` pattern ``bridge_id`` matches ('': none)."""
    for name, pool in pools.items():
        if fnmatch.fnmatchcase(bridge_id, pool.bridges):
            return name
    return ""


class CapacityPlanner:
    def __init__(self, service: ServeParts, pools: Mapping[str, PoolConfig]) -> None:
        self.service, self.pools = service, dict(pools)
        self.specs = pool_specs(pools)
        self.plan: Plan | None = None
        self.at = 0.0
        #: what the hook was last told per pool: (desired, stopped bridges)
        self.told: dict[str, tuple[int, tuple[str, ...]]] = {}
        prefix = service.rt.store.keys.prefix
        self.k_seen = f"{prefix}:capacity:seen"
        self.k_asked = f"{prefix}:capacity:asked"
        self.k_draining = f"{prefix}:capacity:draining"
        self.k_lock = service.rt.store.keys.lock("capacity")
        self.token = f"{time.time()}:{id(self)}"
        #: the tasks submitted lately (seen waiting or in flight), for the forecast
        self.arrivals: dict[str, capacity.Arrival] = {}
        #: when each instance asked for and not registered yet should register (epoch s)
        self.boot_at: list[float] = []

    async def run(self) -> None:
        if not self.pools:
            return
        await every(self.service.rt.settings.capacity_interval_s, self.round, log, "capacity")

    def settings(self) -> capacity.Settings:
        s = self.service.rt.settings
        return capacity.Settings(
            horizon_s=s.capacity_horizon_s,
            miss_cost=s.capacity_miss_cost,
            step_end_s=max(2 * s.capacity_interval_s, 10.0),
            # as long as the dispatch lets a task wait before it pays for it
            deadline_margin=min(max(1.0 - s.share_margin, 0.0), 1.0),
        )

    async def round(self) -> Plan:
        now = time.time()
        jobs, paid, mean_run = await self.read_jobs(now)
        fleet, bridges = await self.read_fleet(now, mean_run)
        got = capacity.plan(jobs, fleet, self.specs, paid, self.settings())
        self.plan, self.at = got, now
        log.info(
            "capacity: %s",
            orjson.dumps(
                {
                    "pools": {n: self.pool_row(d) for n, d in got.pools.items()},
                    "inputs": {
                        "jobs": len(jobs),
                        "deadlines": sum(1 for j in jobs if j.start_by != float("inf")),
                        "meanRunS": round(mean_run, 2),
                        "fleet": [
                            [i.instance_id, i.pool, i.busy, i.boot_eta_s, round(i.billed_s)]
                            for i in fleet
                        ],
                        "paid": {p.name: [p.price, p.cap, len(p.busy_s)] for p in paid.values()},
                    },
                }
            ).decode(),
        )
        self.boot_at = [now + i.free_at() for i in fleet if i.booting]
        if await self.leading():
            await self.act(got, bridges)
            for name, d in got.pools.items():  # asked for now: they boot from now
                started = max(d.desired - d.current - d.booting, 0)
                self.boot_at += [now + self.specs[name].boot_s] * started
        return got

    def booting_at(self) -> list[float]:
        """When each instance the pools were asked for should register (epoch s): the
        dispatch rounds count them as slots that free then, so a task that can wait for
        one within its start deadline is not sent to a paid platform meanwhile."""
        return self.boot_at

    # ---- inputs --------------------------------------------------------------------------

    async def read_jobs(self, now: float) -> tuple[list[Job], dict[str, PaidSpec], float]:
        rt, internal = self.service.rt, self.service.internal
        settings, store = rt.settings, rt.store
        if internal is None:
            return [], {}, settings.share_default_run_s
        queues = [q for q in rt.config.queues() if q[1] in internal.serves]
        if not queues:
            return [], {}, settings.share_default_run_s
        window = await store.reads.window(
            queues, WINDOW, internal.name, dated=WINDOW, busy_max=-1,
            users_max=WINDOW, by_rank=not settings.shares,
        )  # fmt: skip
        runs = window.runs
        mean_run = statistics.fmean(runs.values()) if runs else settings.share_default_run_s
        pipe = rt.redis.pipeline(transaction=False)
        for aigc, platform in queues:
            ext = rt.platforms.adapter_for(platform)
            pipe.zcard(store.keys.wait(aigc, platform))
            pipe.zcard(store.keys.running(aigc, ext.name if ext else platform))
        counts = [int(c) for c in await pipe.execute()]
        paid: dict[str, PaidSpec] = {}
        paid_of: dict[tuple[str, str], str] = {}
        for i, (aigc, platform) in enumerate(queues):
            ext = rt.platforms.adapter_for(platform)
            account = rt.config.account(aigc, platform)
            if ext is None or account is None:
                continue
            name = f"{aigc}/{ext.name}"
            price = settings.overflow_price.get(ext.name, 0.0)
            running = counts[2 * i + 1]
            paid[name] = PaidSpec(name, price, account.concurrency, [mean_run / 2] * running)
            paid_of[(aigc, platform)] = name
        patience = settings.capacity_patience_s
        needs = await self.needs(window.tasks)
        await self.note_arrivals(window.tasks, needs, queues, paid_of, runs, mean_run, now)
        seen: dict[tuple[str, str], int] = {}
        jobs: list[Job] = []
        for t in window.tasks:
            q = (t.aigc, t.platform)
            seen[q] = seen.get(q, 0) + 1
            start_by = t.start_by - now if t.start_by is not None else patience + t.created - now
            run_s = runs.get(t.workflow_id, mean_run)
            jobs.append(
                Job(
                    t.task_id, run_s, max(start_by, 0.0), needs.get(t.task_id, frozenset()),
                    paid=paid_of.get(q, ""),
                )
            )  # fmt: skip
        for i, q in enumerate(queues):
            beyond = max(counts[2 * i] - seen.get(q, 0), 0)
            for k in range(min(beyond, max(JOBS_MAX - len(jobs), 0))):
                jobs.append(Job(f"{q[0]}/{q[1]}#{k}", mean_run, patience, paid=paid_of.get(q, "")))
        horizon = settings.capacity_horizon_s  # then what the horizon may bring
        jobs += capacity.forecast(
            list(self.arrivals.values()), now, recent_s=horizon, horizon_s=horizon,
            patience_s=patience,
        )[:JOBS_MAX]  # fmt: skip
        return jobs, paid, mean_run

    async def needs(self, tasks: list[Windowed]) -> dict[str, frozenset[str]]:
        """The node classes and model files each waiting task's workflow needs, as the hub
        reads them to place it (read once per task), when a pool offers only some."""
        hub = self.service.hub
        if hub is None or not any(spec.offers for spec in self.specs.values()):
            return {}
        queues: dict[tuple[str, str], list[str]] = {}
        for t in tasks:
            queues.setdefault((t.aigc, t.platform), []).append(t.task_id)
        out: dict[str, frozenset[str]] = {}
        for (aigc, platform), ids in queues.items():
            for task_id, need, _ in await hub.assigner.window.read(aigc, platform, len(ids), ids):
                if need is not None:
                    out[task_id] = need.node_classes | need.models
        return out

    async def note_arrivals(
        self,
        waiting: list[Windowed],
        needs: Mapping[str, frozenset[str]],
        queues: list[tuple[str, str]],
        paid_of: Mapping[tuple[str, str], str],
        runs: Mapping[str, float],
        mean_run: float,
        now: float,
    ) -> None:
        """Record the tasks submitted within the horizon that this process has not seen:
        those waiting (the window) and those in flight on any target of the queues (the
        ones that went to our GPUs or overflowed since the last round), with what they need
        (``needs``; one in flight: what the waiting tasks of its workflow need). Bounded: the
        window, and :data:`ARRIVALS_READ` tasks in flight per queue and target."""
        rt, keys = self.service.rt, self.service.rt.store.keys
        keep_s = rt.settings.capacity_horizon_s
        self.arrivals = {i: a for i, a in self.arrivals.items() if a.created >= now - keep_s}
        price = rt.settings.overflow_price
        of_workflow = {t.workflow_id: needs[t.task_id] for t in waiting if t.task_id in needs}

        def arrival(task_id: str, q: tuple[str, str], created: float, workflow: str,
                    start_by: float | None) -> None:  # fmt: skip
            if task_id in self.arrivals or created < now - keep_s:
                return
            target = paid_of.get(q, "")
            self.arrivals[task_id] = capacity.Arrival(
                task_id, created, runs.get(workflow, mean_run),
                None if start_by is None else start_by - created,
                needs.get(task_id, of_workflow.get(workflow, frozenset())), paid=target,
                price=price.get(target.rsplit("/", 1)[-1]) if target else None,
            )  # fmt: skip

        for t in waiting:
            arrival(t.task_id, (t.aigc, t.platform), t.created, t.workflow_id, t.start_by)
        internal = self.service.internal
        pipe = rt.redis.pipeline(transaction=False)
        where: list[tuple[str, str]] = []
        for aigc, platform in queues:
            ext = rt.platforms.adapter_for(platform)
            for target in {internal.name if internal else "", ext.name if ext else ""} - {""}:
                pipe.zrange(keys.running(aigc, target), 0, ARRIVALS_READ - 1)
                where.append((aigc, platform))
        fresh: list[tuple[str, tuple[str, str]]] = []
        for q, ids in zip(where, await pipe.execute(), strict=True):
            fresh += [(text(i), q) for i in ids if text(i) not in self.arrivals]
        if not fresh:
            return
        pipe = rt.redis.pipeline(transaction=False)
        for task_id, _ in fresh:
            pipe.hmget(keys.task(task_id), "created", "workflowId", "startBy")
        for (task_id, q), (created, workflow, start_by) in zip(
            fresh, await pipe.execute(), strict=True
        ):
            if created:
                by = float(start_by) if start_by else None
                arrival(task_id, q, float(created), text(workflow or ""), by)

    async def read_fleet(
        self, now: float, mean_run: float
    ) -> tuple[list[InstanceView], dict[str, dict[str, Any]]]:
        """Every instance of the fleet's bridges (their shared records), with the booting
        ones each pool was asked for; and each bridge's facts the actions need."""
        redis, keys = self.service.rt.redis, self.service.rt.store.keys
        found = [
            key
            async for key in redis.scan_iter(match=keys.bridge("*"), count=200, _type="hash")
            if not keys.is_bridge_tasks(text(key))
        ]
        pipe = redis.pipeline(transaction=False)
        for key in found:
            pipe.hgetall(key)
        records = [{text(k): text(v) for k, v in h.items()} for h in await pipe.execute()]
        pooled = {
            h.get("bridgeId", ""): (pool, h)
            for h in records
            if (pool := pool_of(h.get("bridgeId", ""), self.pools))
            and h.get("online") == "1"
            and not h.get("left")
        }
        pipe = redis.pipeline(transaction=False)
        for bridge_id in pooled:
            pipe.hlen(keys.bridge_tasks(bridge_id))
        held_counts = await pipe.execute()
        bridges: dict[str, dict[str, Any]] = {
            bridge_id: {
                "pool": pool,
                "held": int(held),
                "states": record_instances(h.get("instances")),
            }
            for (bridge_id, (pool, h)), held in zip(pooled.items(), held_counts, strict=True)
        }
        seen_raw = {text(k): float(v) for k, v in (await redis.hgetall(self.k_seen)).items()}
        fresh = {b: now for b in bridges if b not in seen_raw}
        if fresh:
            await redis.hset(self.k_seen, mapping=fresh)  # type: ignore[arg-type]
        gone = [b for b in seen_raw if b not in bridges]
        if gone:
            await redis.hdel(self.k_seen, *gone)
        draining = {text(b) for b in await redis.smembers(self.k_draining)}
        fleet: list[InstanceView] = []
        registered: dict[str, int] = {}
        for bridge_id, b in sorted(bridges.items()):
            states = b["states"] or [{"instanceId": "0", "state": "idle"}]
            busy_any = b["held"] > 0 or any(s.get("state") == "busy" for s in states)
            b["busy"] = busy_any
            for s in states:
                if s.get("state") == "offline":
                    continue
                busy = s.get("state") == "busy" or (busy_any and len(states) == 1)
                fleet.append(
                    InstanceView(
                        bridge_id if len(states) == 1 else f"{bridge_id}/{s.get('instanceId')}",
                        b["pool"],
                        busy=busy,
                        busy_left_s=mean_run / 2 if busy else 0.0,
                        billed_s=now - (seen_raw.get(bridge_id) or fresh.get(bridge_id, now)),
                        draining=bridge_id in draining,
                    )
                )
                registered[b["pool"]] = registered.get(b["pool"], 0) + 1
        fleet += await self.booting(now, registered)
        return fleet, bridges

    async def booting(self, now: float, registered: Mapping[str, int]) -> list[InstanceView]:
        """The instances each pool was asked for that have not registered yet, with their
        ETA (asked at, plus the pool's boot time), for a few boot times after the ask."""
        redis = self.service.rt.redis
        asked = {text(k): orjson.loads(v) for k, v in (await redis.hgetall(self.k_asked)).items()}
        out: list[InstanceView] = []
        for pool, spec in self.specs.items():
            want = asked.get(pool)
            if not want or spec.owned:
                continue
            since, count = float(want["at"]), int(want["desired"])
            if now - since > BOOT_PATIENCE * max(spec.boot_s, 30.0):
                continue
            eta = max(since + spec.boot_s - now, 0.0)
            for k in range(max(count - registered.get(pool, 0), 0)):
                out.append(InstanceView(f"{pool}:booting:{k}", pool, boot_eta_s=eta))
        return out

    # ---- actions (one process) -------------------------------------------------------------

    async def leading(self) -> bool:
        """Whether this process acts this round (it holds or takes the short lock)."""
        redis = self.service.rt.redis
        ttl_ms = int(self.service.rt.settings.capacity_interval_s * 3000)
        if await redis.set(self.k_lock, self.token, nx=True, px=ttl_ms):
            return True
        if text(await redis.get(self.k_lock)) == self.token:
            await redis.pexpire(self.k_lock, ttl_ms)
            return True
        return False

    async def act(self, got: Plan, bridges: Mapping[str, Mapping[str, Any]]) -> None:
        redis = self.service.rt.redis
        draining = {text(b) for b in await redis.smembers(self.k_draining)}
        for gone in draining - set(bridges):
            await redis.srem(self.k_draining, gone)  # stopped: forget it
            draining.discard(gone)
        now = time.time()
        asked = {text(k): orjson.loads(v) for k, v in (await redis.hgetall(self.k_asked)).items()}
        for name, d in got.pools.items():
            if self.specs[name].owned:
                continue  # a fixed size: nothing to start or stop
            stop_bridges = {i.split("/")[0] for i in d.stop}
            to_drain = sorted(b for b in stop_bridges if b not in draining)
            idle_drained = sorted(
                b for b in stop_bridges & draining if not bridges.get(b, {}).get("busy", True)
            )
            active = sum(1 for b, v in bridges.items() if v["pool"] == name and b not in draining)
            if d.desired > active - len(to_drain):
                back = sorted(b for b in draining if bridges.get(b, {}).get("pool") == name)
                for bridge_id in back[: d.desired - active]:
                    await self.set_drain(bridge_id, False)  # the work came back first
                    draining.discard(bridge_id)
            for bridge_id in to_drain:
                await self.set_drain(bridge_id, True)
            told, before = (d.desired, tuple(idle_drained)), self.told.get(name)
            if asked.get(name, {}).get("desired") != d.desired:
                # what was asked and when: booting instances and their ETA (KEDA too)
                await redis.hset(
                    self.k_asked, name, orjson.dumps({"desired": d.desired, "at": now})
                )
            if before != told and (d.desired != d.current or idle_drained):
                await self.hook(name, d.desired, idle_drained)
            self.told[name] = told

    async def set_drain(self, bridge_id: str, drained: bool) -> None:
        service, redis = self.service, self.service.rt.redis
        await Pauses(service.rt).set(PauseKind.BRIDGE, bridge_id, drained, "capacity scale-in")
        if service.hub is not None:
            await service.hub.drain(bridge_id, drained)
        if drained:
            await redis.sadd(self.k_draining, bridge_id)
        else:
            await redis.srem(self.k_draining, bridge_id)
        log.info("capacity: bridge %s %s", bridge_id, "drained" if drained else "undrained")

    async def hook(self, pool: str, desired: int, stop: list[str]) -> None:
        command = self.service.rt.settings.scale_command
        if not command:
            return
        argv = [*shlex.split(command), pool, str(desired), *stop]
        proc = await asyncio.create_subprocess_exec(*argv)
        try:
            code = await asyncio.wait_for(proc.wait(), HOOK_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            code = await proc.wait()
        log.info("capacity: %s -> exit %s", shlex.join(argv), code)
        if code == 0 and stop:
            # stopped: their pauses go, so a new bridge with the same id is not drained
            for bridge_id in stop:
                await Pauses(self.service.rt).set(PauseKind.BRIDGE, bridge_id, False)
                await self.service.rt.redis.srem(self.k_draining, bridge_id)

    # ---- views ---------------------------------------------------------------------------

    @staticmethod
    def pool_row(d: capacity.PoolDecision) -> dict[str, Any]:
        return {
            "pool": d.pool,
            "current": d.current,
            "busy": d.busy,
            "booting": d.booting,
            "desired": d.desired,
            "reason": d.reason,
            "stop": list(d.stop),
            "projectedCost": dict(d.spend),
        }

    def view(self) -> dict[str, Any]:
        got = self.plan
        if got is None:
            return {"at": None, "pools": [], "horizonS": self.settings().horizon_s}
        return {
            "at": self.at,
            "horizonS": got.horizon_s,
            "jobs": got.jobs,
            "pools": [self.pool_row(d) for d in got.pools.values()],
            "projected": {
                name: {
                    "cost": round(o.cost, 4),
                    "rent": round(o.rent, 4),
                    "paid": round(o.paid, 4),
                    "paidTasks": o.paid_tasks,
                    "misses": o.misses,
                }
                for name, o in (
                    ("plan", got.chosen),
                    ("queue", got.queue),
                    ("overflow", got.all_paid),
                )
            },
        }

    def desired(self) -> dict[str, int]:
        got = self.plan
        return {} if got is None else {n: d.desired for n, d in got.pools.items()}


def capacity_router(service: ServeParts, planner: CapacityPlanner) -> APIRouter:
    """``GET /api/capacity`` (admin token) and ``GET /api/capacity/keda`` (the shape KEDA's
    ``metrics-api`` trigger reads: ``valueLocation: desired``; admin or metrics token)."""
    router = APIRouter(tags=["admin"])
    gw = service.gateway

    @router.get(
        "/api/capacity",
        summary="Each pool's current and desired instances, why, and the projected spend",
        responses=error_responses(ErrorCode.AUTH),
    )
    async def capacity_view(authorization: Authorization = None) -> dict[str, Any]:
        require_admin(gw, authorization)
        return planner.view()

    @router.get(
        "/api/capacity/keda",
        summary="One pool's desired instance count, for KEDA's metrics-api trigger",
        responses=error_responses(ErrorCode.AUTH, ErrorCode.CONTROL),
    )
    async def keda(pool: str, authorization: Authorization = None) -> dict[str, Any]:
        token = service.rt.settings.metrics_token
        given = bearer(authorization) or ""
        if not (token and hmac.compare_digest(given, token)):
            require_admin(gw, authorization)
        if pool not in planner.pools:
            raise ClientError(ErrorCode.CONTROL, f"no pool {pool!r} in pools.json")
        got = planner.plan
        decision = got.pools.get(pool) if got else None
        if decision is None:  # no plan yet: hold the pool's floor
            return {"pool": pool, "desired": planner.pools[pool].min, "current": None}
        return {
            "pool": pool,
            "desired": decision.desired,
            "current": decision.current,
            "reason": decision.reason,
        }

    return router
