"""Prometheus metrics: every ``aigcq_*`` metric object and the ``/metrics`` endpoint.

Two kinds:

* **Events** (counters, histograms) are counted by the process that saw them, with one-line
  calls where they happen. With several processes each one exports its own counts; sum
  them in PromQL (``sum by (outcome) (rate(aigcq_tasks_finished_total[5m]))``).
* **State** is derived at scrape time from where the truth lives — Redis (queue depth,
  in flight, oldest wait, health) or the bridge hub (bridges, instances, free slots) — by
  the *sources* given to :func:`endpoint`. Redis-derived state is the same in every process;
  aggregate it with ``max``, not ``sum``.
"""

from __future__ import annotations

import functools
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from starlette.requests import Request
from starlette.responses import Response

from aigcq.plumbing.auth import bearer
from aigcq.plumbing.text import text

log = logging.getLogger(__name__)

#: seconds, from a sub-second hand-off to a task that waited the whole default deadline
#: (600 s) or a longer one: steps of 2.5 s from 10 to 30 s and of 5 s to 60 s, where most
#: generation tasks end, so that a p99 read from them is within a step of the truth (with
#: 10/30/60 s, Prometheus read 29.7 s for a measured 20.6 s). 33 buckets; with the ``aigc``
#: label (projects come from model.json: bounded) a project costs each histogram
#: (platform, target[, outcome]) × 35 series.
LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5,
    10, 12.5, 15, 17.5, 20, 22.5, 25, 27.5, 30, 35, 40, 45, 50, 55, 60,
    75, 90, 120, 180, 300, 600, 1800,
)  # fmt: skip

TASKS_FINISHED = Counter(
    "aigcq_tasks_finished_total",
    "Tasks that reached a terminal state, by where they ran and how they ended.",
    ["aigc", "platform", "target", "outcome"],
)
DISPATCH_LATENCY = Histogram(
    "aigcq_dispatch_latency_seconds",
    "From a task's creation to a claim handing it to a target (every attempt).",
    ["aigc", "platform", "target"],
    buckets=LATENCY_BUCKETS,
)
END_TO_END_LATENCY = Histogram(
    "aigcq_end_to_end_latency_seconds",
    "From a task's creation to its terminal state.",
    ["aigc", "platform", "target", "outcome"],
    buckets=LATENCY_BUCKETS,
)
OVERFLOW_TASKS = Counter(
    "aigcq_overflow_tasks_total",
    "Tasks accepted by a paid external platform.",
    ["aigc", "platform", "target"],
)
START_EXPIRED = Counter(
    "aigcq_start_expired_total",
    "Tasks that ended TaskExpired: their start deadline (maxWaitMs) passed before they "
    "started anywhere (nothing paid).",
    ["aigc", "platform"],
)
OVERFLOW_COST = Counter(
    "aigcq_overflow_cost_total",
    "Spend on external platforms: each paid task's cost when it ended (the platform's "
    "figure, else AIGCQ_OVERFLOW_PRICE per billed unit).",
    ["target"],
)
SPEND = Counter(
    "aigcq_spend",
    "Paid tasks' cost when they ended, by project and account; basis: reported by the "
    "platform, or an estimate (AIGCQ_OVERFLOW_PRICE).",
    ["aigc", "target", "account", "basis"],
)
SPEND_COINS = Counter(
    "aigcq_spend_coins",
    "Coins paid tasks consumed (RunningHub's consumeCoins), by project and account.",
    ["aigc", "target", "account"],
)
BUDGET_REFUSALS = Counter(
    "aigcq_budget_refusals_total",
    "Paid creates not sent because a budget or balance floor of the task's project or "
    "account was reached, by project and target.",
    ["aigc", "target"],
)
RESULT_FILES_COPIED = Counter(
    "aigcq_result_files_copied_total",
    "Paid results' files copied into aigcq's storage (result custody), by target: "
    "kept, or failed (delivered with the vendor's link).",
    ["target", "outcome"],
)
LATE_SUCCESSES = Counter(
    "aigcq_late_successes_total",
    "Paid results that came after their task had failed UncertainSubmit (a create whose "
    "outcome was unknown at the deadline) and won: the client was sent the success after "
    "the failure.",
    ["aigc", "platform", "target"],
)
CALLBACK_REJECTIONS = Counter(
    "aigcq_callback_rejections_total", "TASK_END callbacks refused, by error code.", ["code"]
)
WEBHOOK_FAILURES = Counter(
    "aigcq_webhook_failures_total",
    "Failed TASK_END deliveries of the message-dispatcher: retried, or dropped for good.",
    ["result"],
)
ASYNCH_GATE = Counter(
    "aigcq_asynch_gate_total", "model-asynch queue-limit gate requests.", ["model", "result"]
)
ASYNCH_SEMAPHORE = Counter(
    "aigcq_asynch_semaphore_total",
    "model-asynch concurrency semaphore requests.",
    ["model", "result"],
)

#: an async function returning metric families read at scrape time
Source = Callable[[], Awaitable[list[Metric]]]


# ---- event hooks (one call each where the event happens) ----------------------------------


@functools.cache
def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once: resolving labels costs twice the count
    itself, on every task (prometheus-client keeps each child for good anyway)."""
    return metric.labels(*labels)


def task_finished(fields: Sequence[str | bytes | None], outcome: str, now: float) -> None:
    """``fields``: the task hash's ``AIGC``, ``platform``, ``target``, ``created``."""
    aigc, platform, target, created = (text(f) for f in fields)
    target = target or "none"  # ended before any target took it (e.g. cancelled waiting)
    _child(TASKS_FINISHED, aigc, platform, target, outcome).inc()
    if created:
        _child(END_TO_END_LATENCY, aigc, platform, target, outcome).observe(now - float(created))


def tasks_claimed(
    aigc: str, platform: str, target: str, created: Iterable[float], now: float
) -> None:
    histogram = _child(DISPATCH_LATENCY, aigc, platform, target)
    for at in created:
        histogram.observe(max(0.0, now - at))


def overflowed(aigc: str, platform: str, target: str) -> None:
    _child(OVERFLOW_TASKS, aigc, platform, target).inc()


def start_expired(aigc: str, platform: str) -> None:
    _child(START_EXPIRED, aigc, platform).inc()


def spent(
    aigc: str, target: str, account: str, amount: float, estimate: bool, coins: float
) -> None:
    """A paid task ended, charged ``amount`` (and ``coins``)."""
    _child(OVERFLOW_COST, target).inc(amount)
    _child(SPEND, aigc, target, account, "estimate" if estimate else "reported").inc(amount)
    if coins:
        _child(SPEND_COINS, aigc, target, account).inc(coins)


def budget_refused(aigc: str, target: str) -> None:
    _child(BUDGET_REFUSALS, aigc, target).inc()


def result_file_copied(target: str, *, ok: bool) -> None:
    _child(RESULT_FILES_COPIED, target, "kept" if ok else "failed").inc()


def late_success(aigc: str, platform: str, target: str) -> None:
    _child(LATE_SUCCESSES, aigc, platform, target).inc()


def callback_rejected(code: str) -> None:
    _child(CALLBACK_REJECTIONS, code).inc()


def webhook_failed(dropped: bool) -> None:
    _child(WEBHOOK_FAILURES, "dropped" if dropped else "retry").inc()


def gate_taken(model: str, ok: bool) -> bool:
    """Count and pass through one gate request."""
    _child(ASYNCH_GATE, model, "taken" if ok else "full").inc()
    return ok


def semaphore_acquired(model: str, ok: bool) -> bool:
    """Count and pass through one semaphore request."""
    _child(ASYNCH_SEMAPHORE, model, "acquired" if ok else "busy").inc()
    return ok


# ---- exposition -------------------------------------------------------------------------


class _Snapshot:
    """A collector over families already read (collectors are sync; Redis reads are not)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families

    def describe(self) -> Iterable[Metric]:
        return []


async def families(sources: Iterable[Source]) -> list[Metric]:
    """What ``/metrics`` shows: the process-wide event metrics, then each source's state.

    The sources are read first and the counters after, so a task that ends during a scrape
    can show both in a state gauge (in flight) and in a counter (finished)."""
    state: list[Metric] = []
    for source in sources:
        try:
            state += await source()
        except Exception:  # a scrape must not fail because one source did
            log.exception("metrics source %s failed", getattr(source, "__qualname__", source))
    return [*REGISTRY.collect(), *state]


async def exposition(sources: Iterable[Source]) -> bytes:
    """The text format of :func:`families`."""
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(_Snapshot(await families(sources)))
    return generate_latest(scrape)


def endpoint(*sources: Source, token: str = "") -> Callable[[Request], Awaitable[Response]]:
    """A ``GET /metrics`` handler over the event metrics and ``sources``; with a ``token``
    (``AIGCQ_METRICS_TOKEN``) only for ``Authorization: Bearer <token>``, else 401."""

    async def metrics(request: Request) -> Response:
        if token and not _bearer_is(request, token):
            headers = {"WWW-Authenticate": 'Bearer realm="metrics"'}
            return Response("metrics token required\n", 401, headers, "text/plain")
        return Response(await exposition(sources), media_type=CONTENT_TYPE_LATEST)

    return metrics


def _bearer_is(request: Request, token: str) -> bool:
    given = bearer(request.headers.get("authorization")) or ""
    return hmac.compare_digest(given.encode(), token.encode())


def age(created: Any, now: float | None = None) -> float:
    """Seconds since the epoch time ``created`` (0 when unknown)."""
    return max(0.0, (now or time.time()) - float(created)) if created else 0.0
