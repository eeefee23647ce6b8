"""What the paid platforms cost: each paid task's cost when it ends, kept in Redis.

A task that ends on a paid platform (its result, or a failure the platform reported) is
charged what the platform's answer says it cost (:class:`aigcq.platforms.base.Cost`):
RunningHub's ``consumeMoney`` (plus ``thirdPartyConsumeMoney``) as the amount and its
``consumeCoins`` as coins; where no money is reported (a platform whose spec's ``cost`` has
no ``money``, a RunningHub key billed in coins, a failure) the configured price,
``AIGCQ_OVERFLOW_PRICE`` per billed unit (``Cost.units``: a task, or each output where the
platform bills per output), marked as an estimate (0 without a price).

The end that bills a run makes its charge *due* in the same atomic step (a task end
applied on a paid target, a retried paid failure, an unwanted run's release:
``charge_due`` in ``queue/lua/_prelude.lua`` keeps the reported cost on the task and
indexes it in ``{P}:dues``). The charge is then made, in one step that also removes the
due (``queue/lua/charge.lua``, through :meth:`aigcq.queue.store.TaskStore.charge`), so it
happens exactly once: right after the end by the process that applied it, or, if that
process died (or Redis failed it) in between, by the sweep once it has been due
:data:`DUE_GRACE_S`. It goes to the hash of the day and month the run ended in (in
``AIGCQ_SPEND_TIMEZONE``, UTC by default) (``Keys.spend``), per project, account and
workflow (fields ``["w", AIGC, target, account, workflow, figure]``), with the project's
(``["p", AIGC, figure]``) and the account's (``["a", target, account, figure]``) totals
beside (what a budget reads), and is kept on the task (its ``cost`` field). A run the task
no longer wanted (an orphan: cancelled, superseded, given up on at its deadline) is
charged too, once, by what frees its slot on seeing it ended with a result or a failure:
its own TASK_END (``MoveResult.released``, see
:meth:`aigcq.scheduler.lifecycle.Lifecycle.settle`) or the orphan check
(:mod:`.orphan_checks`), whichever releases it; it adds to the ``tasks`` figure, which
counts charged runs. Every process sharing the Redis reads the same figures.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
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
#: how long a charge may stay due before the sweep makes it (its process charges it at once)
DUE_GRACE_S = 30.0
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


def due_cost(outcome: Succeeded | Failed) -> bytes:
    """What a run's end reported it cost, as the scripts keep it on a charge due."""
    return orjson.dumps(asdict(outcome.cost))


def period_names(now: float, zone: str = "UTC") -> dict[str, str]:
    """The day and month ``now`` falls in, in time zone ``zone`` (``AIGCQ_SPEND_TIMEZONE``)."""
    day = datetime.fromtimestamp(now, ZoneInfo(zone)).strftime("%Y-%m-%d")
    return {"day": day, "month": day[:7]}


class SpendLedger:
    """Makes each billed run's charge (:meth:`charge_due`) and reads a period's (:meth:`view`)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def charge_due(self, task_id: str) -> int:
        """Charge every billed run of the task whose charge is due (the end that billed
        it made it due, in the same step: ``charge_due`` in ``queue/lua/_prelude.lua``);
        how many this call charged. Each is charged once, by whichever process gets there
        first (this one, right after the end; the sweep, if it died between). A Redis
        that does not answer leaves the charge due (logged) for the sweep."""
        try:
            queue, dues = await self.rt.store.reads.dues(task_id)
            charged = 0
            for due, value in dues.items():
                charged += await self._charge(task_id, queue, due, value)
            return charged
        except RedisError as exc:
            log.warning(
                "task %s: its charge is not recorded yet (the sweep retries): %r",
                task_id,
                exc,
                extra=ctx(task=task_id),
            )
            return 0

    async def charge_overdue(self, grace_s: float = DUE_GRACE_S) -> int:
        """Charges due for longer than ``grace_s`` (a process died after the end that
        billed a run, before it charged it): charged now; how many."""
        ids = await self.rt.store.reads.overdue(self.rt.clock() - grace_s)
        return sum([await self.charge_due(task_id) for task_id in ids])

    async def _charge(self, task_id: str, queue: tuple[str, str], due: str, value: str) -> int:
        at, _, cost_json = value.split(" ", 2)
        target = due.split(".", 2)[2]
        rt = self.rt
        adapter = rt.platforms.adapters.get(target)
        cost = Cost(**orjson.loads(cost_json))
        apikey = rt.apikey(*queue)
        # a platform no longer configured (restarted without it): charged, account unknown
        account = adapter.account_id(apikey) if adapter is not None else ""
        c = charge(cost, rt.settings.overflow_price.get(target))
        # the period the run ended in, on the runtime's clock (``at`` is Redis-side time)
        ended_at = rt.clock() - max(0.0, time.time() - float(at))
        names = period_names(ended_at, rt.settings.spend_timezone)
        record = {"amount": c.amount, "estimate": c.estimate, "account": account}
        record |= {"coins": cost.coins, "seconds": cost.seconds, "tokens": cost.tokens}
        record["units"] = cost.units
        charged = await rt.store.charge(
            task_id,
            due,
            target=target,
            account=account,
            default_workflow=adapter.workflow_of("", apikey) if adapter is not None else "",
            periods={p: (names[p], KEEP_S[p]) for p in names},
            record=record,
            figures={
                "amount": c.amount,
                "estimated": c.amount if c.estimate else 0.0,
                "coins": c.coins,
                "seconds": c.seconds,
            },
        )
        if not charged:
            return 0
        metrics.spent(queue[0], target, account, c.amount, c.estimate, c.coins)
        log.debug(
            "task %s: cost %s on %s (%s)",
            task_id,
            c.amount,
            target,
            "estimate" if c.estimate else "reported",
            extra=ctx(task=task_id),
        )
        return 1

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
