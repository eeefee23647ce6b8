"""What the paid platforms cost: each paid task's cost when it ends, kept in Redis.

A task that ends on a paid platform (its result, or a failure the platform reported) is
charged what the platform's answer says it cost (:class:`aigcq.platforms.base.Cost`):
RunningHub's ``consumeMoney`` (plus ``thirdPartyConsumeMoney``) as the amount and its
``consumeCoins`` as coins; where no money is reported (Coze, JimuAI, a RunningHub key
billed in coins, a failure) the configured price, ``AIGCQ_OVERFLOW_PRICE`` per billed unit
(a task; JimuAI's output images), marked as an estimate (0 without a price).

The charge is added, in one step (``queue/lua/charge.lua``, through
:meth:`aigcq.queue.store.TaskStore.record_cost`), to the hash of its day and of its month
(in ``AIGCQ_SPEND_TIMEZONE``, UTC by default)
(``Keys.spend``), per project, account and workflow (fields ``["w", AIGC, target, account,
workflow, figure]``), with the project's (``["p", AIGC, figure]``) and the account's
(``["a", target, account, figure]``) totals beside (what a budget reads), and kept on the
task (its ``cost`` field). A run the task no longer wanted (an orphan: cancelled,
superseded, given up on at its deadline) is charged too, once, by what frees its slot on
seeing it ended with a result or a failure: its own TASK_END (``MoveResult.released``, see
:meth:`aigcq.scheduler.lifecycle.Lifecycle.settle`) or the orphan check
(:mod:`.orphan_checks`), whichever releases it (one atomic step); it adds to the ``tasks``
figure, which counts charged runs. Every
process sharing the Redis reads the same figures. It is written right after the task's
end is applied, once (only the move that ended the task records it): a process that dies
between the two loses that one charge.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo

import orjson
from redis.exceptions import RedisError

from aigcq.observability import metrics
from aigcq.observability.jsonlog import ctx
from aigcq.platforms.base import Cost, Failed, Succeeded
from aigcq.plumbing.text import text
from aigcq.runtime import Runtime

log = logging.getLogger(__name__)

Period = Literal["day", "month"]
#: how long each period's hash is kept after its last charge
KEEP_S: dict[str, int] = {"day": 93 * 86400, "month": 3 * 366 * 86400}
#: the figures kept per row
FIGURES = ("amount", "estimated", "coins", "seconds", "tasks")
#: rows a view lists per kind at most (the largest amounts)
VIEW_ROWS = 50


@dataclass(frozen=True, slots=True)
class Charge:
    """What one task is charged: ``amount`` (the platform's money, else the configured
    price), whether that is an ``estimate``, and the coins and seconds it reported."""

    amount: float
    estimate: bool
    coins: float = 0.0
    seconds: float = 0.0


def charge(cost: Cost, price: float | None) -> Charge:
    """The charge of a run that cost ``cost``, its platform priced ``price`` per unit."""
    coins, seconds = cost.coins or 0.0, cost.seconds or 0.0
    if cost.money is not None:
        return Charge(cost.money, False, coins, seconds)
    return Charge(round((price or 0.0) * cost.units, 6), True, coins, seconds)


def period_names(now: float, zone: str = "UTC") -> dict[str, str]:
    """The day and month ``now`` falls in, in time zone ``zone`` (``AIGCQ_SPEND_TIMEZONE``)."""
    day = datetime.fromtimestamp(now, ZoneInfo(zone)).strftime("%Y-%m-%d")
    return {"day": day, "month": day[:7]}


class SpendLedger:
    """Records each paid task's charge (:meth:`ended`) and reads a period's (:meth:`view`)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def ended(
        self,
        task_id: str,
        target: str,
        outcome: Succeeded | Failed,
        queue: tuple[str, str] | None = None,
        *,
        run: bool = False,
    ) -> None:
        """The task (of ``queue``: AIGC, platform, when known) ended on ``target`` with
        ``outcome``: charge it if ``target`` is paid. ``run``: a run of the task that it no
        longer wanted (an orphan), charged without a record on the task. A Redis that does
        not answer loses the charge (logged), never the task's end."""
        adapter = self.rt.platforms.adapters.get(target)
        if adapter is None or not adapter.paid:
            return
        try:
            queue = queue or await self._queue(task_id)
            await self._record(task_id, target, outcome.cost, queue, on_task=not run)
        except RedisError as exc:
            log.warning(
                "task %s: its cost on %s is not recorded: %r",
                task_id,
                target,
                exc,
                extra=ctx(task=task_id),
            )

    async def _queue(self, task_id: str) -> tuple[str, str]:
        aigc, platform = await self.rt.redis.hmget(
            self.rt.store.keys.task(task_id), "AIGC", "platform"
        )
        return text(aigc or ""), text(platform or "")

    async def _record(
        self, task_id: str, target: str, cost: Cost, queue: tuple[str, str], *, on_task: bool
    ) -> None:
        rt = self.rt
        adapter, apikey = rt.platforms.adapters[target], rt.apikey(*queue)
        account = adapter.account_id(apikey)
        c = charge(cost, rt.settings.overflow_price.get(target))
        names = period_names(rt.clock(), rt.settings.spend_timezone)
        record = {"amount": c.amount, "estimate": c.estimate, "account": account}
        record |= {"coins": cost.coins, "seconds": cost.seconds, "tokens": cost.tokens}
        record["units"] = cost.units
        await rt.store.record_cost(
            task_id,
            target=target,
            account=account,
            default_workflow=adapter.workflow_of("", apikey),
            periods={p: (names[p], KEEP_S[p]) for p in names},
            record=record if on_task else None,
            figures={
                "amount": c.amount,
                "estimated": c.amount if c.estimate else 0.0,
                "coins": c.coins,
                "seconds": c.seconds,
            },
        )
        metrics.spent(queue[0], target, account, c.amount, c.estimate, c.coins)
        log.debug(
            "task %s: cost %s on %s (%s)",
            task_id,
            c.amount,
            target,
            "estimate" if c.estimate else "reported",
            extra=ctx(task=task_id),
        )

    async def view(self, period: Period, now: float | None = None) -> dict[str, Any]:
        """A period's figures: its total, and per project, account and workflow (the
        largest :data:`VIEW_ROWS` of each, by amount)."""
        rt = self.rt
        name = period_names(rt.clock() if now is None else now, rt.settings.spend_timezone)[period]
        raw = await self.rt.redis.hgetall(self.rt.store.keys.spend(period, name))
        grouped: dict[str, dict[tuple[str, ...], dict[str, float]]] = {"w": {}, "p": {}, "a": {}}
        for field, value in raw.items():
            kind, *names, figure = orjson.loads(text(field))
            row = grouped[kind].setdefault(tuple(names), dict.fromkeys(FIGURES, 0.0))
            row[figure] = float(text(value))
        labels = {
            "w": ("AIGC", "target", "account", "workflow"),
            "p": ("AIGC",),
            "a": ("target", "account"),
        }
        lists = {kind: _listed(rows, labels[kind]) for kind, rows in grouped.items()}
        total = dict.fromkeys(FIGURES, 0.0)
        for row in grouped["p"].values():
            for figure in FIGURES:
                total[figure] += row[figure]
        return {
            "period": name,
            "total": _rounded(total),
            "projects": lists["p"],
            "accounts": lists["a"],
            "workflows": lists["w"],
        }


def _rounded(figures: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {k: round(v, 6) for k, v in figures.items()}
    out["tasks"] = int(figures["tasks"])
    return out


def _listed(
    rows: dict[tuple[str, ...], dict[str, float]], labels: tuple[str, ...]
) -> list[dict[str, Any]]:
    ordered = sorted(rows.items(), key=lambda item: -item[1]["amount"])[:VIEW_ROWS]
    return [dict(zip(labels, names, strict=True)) | _rounded(f) for names, f in ordered]
