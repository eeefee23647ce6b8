"""The state an ``aigcq serve`` process exports on ``/metrics``, read at scrape time.

Queues, in-flight counts, back-off and health come from Redis (the same in every process
sharing it); bridges and internal free slots from this process's own target.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from aigcq.health import Health, HealthState
from aigcq.observability.metrics import age

if TYPE_CHECKING:
    from aigcq.serve.parts import ServeParts


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class ServeState:
    """A metrics source (see :func:`aigcq.observability.metrics.endpoint`) for one process."""

    def __init__(
        self, service: ServeParts, desired: Callable[[], Mapping[str, int]] | None = None
    ) -> None:
        self.service = service
        #: each pool's desired instance count, as the capacity planner last decided
        self.desired = desired or dict

    async def __call__(self) -> list[Metric]:
        return [
            *await self._redis_state(),
            *await self._paid_accounts(),
            *await self._budgets(),
            *self._internal(),
            self._desired(),
        ]

    def _desired(self) -> Metric:
        """``aigcq_desired_instances{pool}``: what an autoscaler follows (docs/capacity.md)."""
        gauge = _gauge(
            "aigcq_desired_instances",
            "Instances each pool of pools.json should run, as the capacity planner decided.",
            ["pool"],
        )
        for pool, count in sorted(self.desired().items()):
            gauge.add_metric([pool], count)
        return gauge

    async def _paid_accounts(self) -> list[Metric]:
        """Each polled paid account as the last reconciliation found it (every process
        exports the same figures, from Redis)."""
        labels = ["target", "account"]
        tasks = _gauge(
            "aigcq_paid_account_tasks",
            "A paid account's live tasks, as its platform counts them (side=theirs) and as "
            "we do (side=ours: running, orphans, creates whose outcome is unknown).",
            [*labels, "side"],
        )
        drift = _gauge(
            "aigcq_paid_account_drift",
            "The platform's count of an account's live tasks minus ours (> 0: tasks we do "
            "not know of; < 0: a record of ours may be stale).",
            labels,
        )
        coins = _gauge("aigcq_paid_account_coins", "An account's remainCoins as polled.", labels)
        for row in await self.service.reconciler.view():
            names = [row["target"], row["account"]]
            if row["theirs"] is None:
                continue
            tasks.add_metric([*names, "theirs"], row["theirs"])
            tasks.add_metric([*names, "ours"], row["ours"])
            drift.add_metric(names, row["drift"])
            if row["remainCoins"] is not None:
                coins.add_metric(names, row["remainCoins"])
        return [tasks, drift, coins]

    async def _budgets(self) -> list[Metric]:
        """Every configured spend limit with its period's spend so far, and the automatic
        holds in force."""
        labels = ["scope", "name", "period"]
        limit = _gauge("aigcq_budget_limit", "A configured spend limit.", labels)
        spent = _gauge("aigcq_budget_spent", "What a limit's period spent so far.", labels)
        reached = _gauge("aigcq_budget_reached", "1 while a limit is reached.", labels)
        view = await self.service.paid.budgets.view()
        rows = [("project", p["AIGC"], p) for p in view["projects"]]
        rows += [("account", f"{a['target']}/{a['account']}", a) for a in view["accounts"]]
        for scope, name, row in rows:
            for period in ("day", "month"):
                figure = row[period]
                if figure["limit"] is None:
                    continue
                limit.add_metric([scope, name, period], figure["limit"])
                spent.add_metric([scope, name, period], figure["spent"])
                reached.add_metric([scope, name, period], int(figure["reached"]))
        holds = _gauge(
            "aigcq_paid_holds",
            "1 while a project's paid target is held automatically (cause: budget, drift).",
            ["aigc", "target", "cause"],
        )
        paused = await self.service.rt.redis.hkeys(self.service.rt.store.keys.pauses)
        for field in paused:
            kind, _, name = str(field).partition(":")
            cause, _, where = name.partition(":")
            aigc, _, target = where.rpartition("/")
            if kind == "hold" and aigc:
                holds.add_metric([aigc, target, cause], 1)
        return [limit, spent, reached, holds]

    def _targets(self) -> list[tuple[str, str]]:
        """(AIGC, target) pairs that may have tasks in flight."""
        rt, internal = self.service.rt, self.service.internal
        pairs: set[tuple[str, str]] = set()
        for aigc, platform in rt.config.queues():
            ext = rt.platforms.adapter_for(platform)
            if ext is not None:
                pairs.add((aigc, ext.name))
            if internal is not None and platform in internal.serves:
                pairs.add((aigc, internal.name))
        return sorted(pairs)

    async def _redis_state(self) -> list[Metric]:
        rt = self.service.rt
        keys, queues, targets = rt.store.keys, rt.config.queues(), self._targets()
        pipe = rt.redis.pipeline(transaction=False)
        for aigc, platform in queues:
            pipe.zcard(keys.wait(aigc, platform))
            pipe.zrange(keys.wait(aigc, platform), 0, 0)
        for aigc, target in targets:
            pipe.zcard(keys.running(aigc, target))
        pipe.zcard(keys.delayed)
        *counts, delayed = await pipe.execute()
        heads = [h[0] if h else None for h in counts[1 : 2 * len(queues) : 2]]
        created = await self._created(heads)
        now = time.time()
        depth = _gauge("aigcq_queue_depth", "Tasks waiting, per queue.", ["aigc", "platform"])
        oldest = _gauge(
            "aigcq_queue_oldest_wait_seconds",
            "How long the task at the head of the queue has existed.",
            ["aigc", "platform"],
        )
        for i, (aigc, platform) in enumerate(queues):
            depth.add_metric([aigc, platform], int(counts[2 * i]))
            oldest.add_metric([aigc, platform], age(created[i], now))
        inflight = _gauge("aigcq_tasks_in_flight", "Tasks on a target.", ["aigc", "target"])
        for i, (aigc, target) in enumerate(targets):
            inflight.add_metric([aigc, target], int(counts[2 * len(queues) + i]))
        backoff = GaugeMetricFamily("aigcq_tasks_delayed", "Tasks backing off.", value=delayed)
        return [depth, oldest, inflight, backoff, *self._capacity()]

    async def _created(self, heads: list[Any]) -> list[Any]:
        """The ``created`` time of each head task (None for an empty queue)."""
        pipe = self.service.rt.redis.pipeline(transaction=False)
        for task_id in heads:
            pipe.hget(self.service.rt.store.keys.task(str(task_id or "")), "created")
        return list(await pipe.execute()) if heads else []

    def _capacity(self) -> list[Metric]:
        rt = self.service.rt
        cap = _gauge(
            "aigcq_external_capacity",
            "Configured concurrency of a queue's external platform (model.json).",
            ["aigc", "platform", "target"],
        )
        for aigc, platform in rt.config.queues():
            ext, account = rt.platforms.adapter_for(platform), rt.config.account(aigc, platform)
            if ext is not None and account is not None:
                cap.add_metric([aigc, platform, ext.name], account.concurrency)
        return [cap]

    def _internal(self) -> list[Metric]:
        """Internal capacity as this process sees it; per bridge when it runs the hub."""
        internal, hub = self.service.internal, self.service.hub
        if internal is None:
            return []
        free = GaugeMetricFamily(
            "aigcq_internal_free_slots",
            "Free internal slots offered to the dispatcher (0 while not healthy).",
            labels=["target"],
        )
        free.add_metric([internal.name], internal.free_slots())
        health = _health(internal.health_view)
        if hub is None:
            return [free, *health]
        bridges = hub.registry.live()
        count = GaugeMetricFamily(
            "aigcq_bridges_connected", "Bridges connected to this process.", value=len(bridges)
        )
        instances = _gauge("aigcq_bridge_instances", "Instances per bridge.", ["bridge"])
        slots = _gauge("aigcq_bridge_free_slots", "Free slots per bridge.", ["bridge"])
        quarantined = _gauge(
            "aigcq_bridge_quarantined", "1 while a bridge is out of rotation.", ["bridge"]
        )
        for b in bridges:
            instances.add_metric([b.bridge_id], b.instance_count)
            slots.add_metric([b.bridge_id], b.free())
            quarantined.add_metric([b.bridge_id], int(b.quarantined_at is not None))
        return [free, count, instances, slots, quarantined, *health]


def _health(health: Health) -> list[Metric]:
    """This process's view of internal capacity (in the split topology, of the dispatcher):
    the state as a one-hot gauge, degrade / recover counts since it started."""
    state = _gauge("aigcq_internal_health", "Internal capacity health (1 = current).", ["state"])
    for s in HealthState:
        state.add_metric([s.value], int(health.state is s))
    degrades = CounterMetricFamily(
        "aigcq_internal_degrades",
        "Times internal capacity went from healthy to degraded (this process's view).",
        value=health.degrades,
    )
    recovers = CounterMetricFamily(
        "aigcq_internal_recovers", "Times internal capacity recovered.", value=health.recovers
    )
    return [state, degrades, recovers]
