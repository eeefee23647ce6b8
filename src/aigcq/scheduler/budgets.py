"""Budgets and balance floors: no new paid create past a project's or an account's limit.

Limits are set in ``model.json``: a project's ``budget`` beside its platforms (``day``,
``month``: its spend over all its paid platforms; ``on_limit``: ``wait`` or ``fail``) and
an account's ``budget`` in its entry (``day``, ``month``: the spend of its key, whichever
project used it; ``balance_floor``: RunningHub's ``remainCoins`` as the reconciliation last
polled it, :mod:`.accounts`). Several projects configuring one key: its smallest limits
hold. Spend is the amount :mod:`.spend` records (the platform's money, else the configured
price) in the hashes of the day and month of ``AIGCQ_SPEND_TIMEZONE``, so a limit resets
with its period there.

The check is made in the script that records a create's intent (``begin_create.lua``,
:meth:`aigcq.queue.store.TaskStore.begin_create`), in the same step: a create is sent only
if, at that moment, every limit is above what Redis has recorded, whichever process
charged it. At a limit nothing is sent, and the task

* waits (``on_limit: wait``, the default): it goes back to the head of its queue, its
  attempt given back, and its project's paid target gets an automatic hold (``hold`` in
  the pauses hash, ``budget:<AIGC>/<target>``, :mod:`.pauses`), so the dispatch rounds
  give that platform no task and the queue waits for internal capacity; the hold is
  lifted (:meth:`Budgets.lift_holds`, every :data:`CHECK_S` s in each process) once the
  limit no longer holds: a new day or month, a raised limit, a balance above its floor;
* fails ``BudgetExceeded`` (``on_limit: fail``; code.json's message).

Each refusal counts in ``aigcq_budget_refusals_total``; a new hold is logged as a warning.

The bound: spend is recorded when a task ends, so the creates in flight when a limit is
crossed still add their cost. The last create a limit lets through is sent while the
recorded spend is below the limit, and at that moment at most ``C`` creates of the project
(or account) are in flight uncharged, that one included, where ``C`` is the sum of the
caps (``concurrency``) of its paid accounts: the claim script holds each cap fleet-wide,
orphans included. So the spend of a period stays below ``limit + C * c_max`` (``c_max``:
the most one task costs), however many serve processes share the Redis. A charge lost to a
process that dies between a task's end and its charge is not counted at all.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from aigcq.config import AccountBudget, ProjectBudget
from aigcq.observability import metrics
from aigcq.plumbing.background import every
from aigcq.queue.store import Begun
from aigcq.runtime import Runtime
from aigcq.scheduler.pauses import HOLD_BUDGET, PauseKind, Pauses
from aigcq.scheduler.spend import Period, SpendLedger, period_names

log = logging.getLogger(__name__)

#: how often each process looks whether its automatic budget holds still hold (s)
CHECK_S = 5.0
PERIODS: tuple[Period, Period] = ("day", "month")


@dataclass(frozen=True, slots=True)
class AccountLimits:
    """One paid account's limits (its key's, the smallest any project configures)."""

    target: str
    account: str
    day: float | None = None
    month: float | None = None
    balance_floor: float | None = None

    def limit(self, period: Period) -> float | None:
        return self.day if period == "day" else self.month


def _smallest(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return min(found) if found else None


class Budgets:
    """The limits ``model.json`` sets, as the create script checks them, and their view."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.spend = SpendLedger(rt)

    def project(self, aigc: str) -> ProjectBudget | None:
        return self.rt.config.budgets.get(aigc)

    def fails(self, aigc: str) -> bool:
        """Whether the project's tasks fail ``BudgetExceeded`` at a limit (else they wait)."""
        budget = self.project(aigc)
        return budget is not None and budget.on_limit == "fail"

    def account(self, aigc: str, platform: str, target: str) -> AccountLimits:
        """The limits of the account the queue runs on ``target``: its own entry's budget,
        and every other project's entry with the same key on the same target."""
        apikey = self.rt.apikey(aigc, platform)
        adapter = self.rt.platforms.adapters[target]
        found: list[AccountBudget] = []
        for project, other in self.rt.config.queues():
            entry = self.rt.config.account(project, other)
            ext = self.rt.platforms.adapter_for(other)
            if entry and entry.budget and ext and ext.name == target and entry.apikey == apikey:
                found.append(entry.budget)
        return AccountLimits(
            target,
            adapter.account_id(apikey),
            _smallest(b.day for b in found),
            _smallest(b.month for b in found),
            _smallest(b.balance_floor for b in found),
        )

    def gate(self, aigc: str, platform: str, target: str) -> str:
        """The budgets a create of the queue on ``target`` must fit, as the scripts read
        them (JSON; "" when it has none)."""
        project, account = self.project(aigc), self.account(aigc, platform, target)
        limits: list[list[Any]] = []
        for period in PERIODS:
            if (p := _project_limit(project, period)) is not None:
                limits.append(["p", period, p])
            if (a := account.limit(period)) is not None:
                limits.append(["a", period, a])
        if not limits and account.balance_floor is None:
            return ""
        names = period_names(self.rt.clock(), self.rt.settings.spend_timezone)
        gate: dict[str, Any] = {
            "project": aigc,
            "target": target,
            "account": account.account,
            "limits": limits,
            **names,
        }
        if account.balance_floor is not None:
            gate["floor"] = account.balance_floor
        if not self.fails(aigc):
            gate["hold"] = True
        return orjson.dumps(gate).decode()

    def refused(self, aigc: str, target: str, begun: Begun) -> None:
        """A create of ``aigc`` on ``target`` was not sent: ``begun.reached``."""
        metrics.budget_refused(aigc, target)
        if begun.held:
            log.warning(
                "budget: %s; %s takes no new paid create on %s until it no longer holds "
                "(its tasks wait for internal capacity)",
                begun.reached,
                aigc,
                target,
            )

    # ---- automatic holds ----------------------------------------------------------------

    async def run(self) -> None:
        await every(CHECK_S, self.lift_holds, log, "checking the budget holds")

    async def lift_holds(self) -> int:
        """Lift every automatic budget hold whose limits no longer hold; how many."""
        pauses, lifted = Pauses(self.rt), 0
        for p in await pauses.all():
            cause, _, where = p.name.partition(":")
            if p.kind is not PauseKind.HOLD or cause != HOLD_BUDGET:
                continue
            queue = self._queue_of(where)
            gate = self.gate(*queue) if queue else ""
            reached = await self.rt.store.reads.budget_reached(gate) if gate else ""
            if not reached and await pauses.set(PauseKind.HOLD, p.name, False):
                log.warning("budget: %s takes paid creates again (%s no longer holds)", where,
                            p.note)  # fmt: skip
                lifted += 1
        return lifted

    def _queue_of(self, where: str) -> tuple[str, str, str] | None:
        """(AIGC, platform, target) of a hold's ``AIGC/target`` (None: no such queue now)."""
        aigc, _, target = where.rpartition("/")
        for project, platform in self.rt.config.queues():
            adapter = self.rt.platforms.adapter_for(platform)
            if project == aigc and adapter is not None and adapter.name == target:
                return aigc, platform, target
        return None

    # ---- the operator's view --------------------------------------------------------------

    async def view(self, spent: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """Every configured limit with what its period spent so far, and whether reached
        (``spent``: the spend views of the day and month, when the caller has them)."""
        if spent is None:
            spent = {period: await self.spend.view(period) for period in PERIODS}
        projects = []
        for aigc, budget in sorted(self.rt.config.budgets.items()):
            row: dict[str, Any] = {"AIGC": aigc, "onLimit": budget.on_limit}
            for period in PERIODS:
                amount = _amount(spent[period]["projects"], AIGC=aigc)
                row[period] = _figure(
                    _project_limit(budget, period), amount, spent[period]["period"]
                )
            projects.append(row)
        accounts = []
        for limits in self._accounts():
            acct: dict[str, Any] = {"target": limits.target, "account": limits.account}
            for period in PERIODS:
                amount = _amount(
                    spent[period]["accounts"], target=limits.target, account=limits.account
                )
                acct[period] = _figure(limits.limit(period), amount, spent[period]["period"])
            coins = await self.rt.redis.hget(
                self.rt.store.keys.paid_account(limits.target, limits.account), "remainCoins"
            )
            acct["balanceFloor"] = limits.balance_floor
            acct["remainCoins"] = None if coins is None else float(coins)
            acct["floorReached"] = (
                limits.balance_floor is not None
                and coins is not None
                and float(coins) <= limits.balance_floor
            )
            accounts.append(acct)
        return {"timezone": self.rt.settings.spend_timezone, "projects": projects,
                "accounts": accounts}  # fmt: skip

    def _accounts(self) -> list[AccountLimits]:
        """Each paid account with a limit, once."""
        seen: dict[tuple[str, str], AccountLimits] = {}
        for aigc, platform in self.rt.config.queues():
            adapter = self.rt.platforms.adapter_for(platform)
            if adapter is None or not adapter.paid:
                continue
            limits = self.account(aigc, platform, adapter.name)
            if (limits.day, limits.month, limits.balance_floor) != (None, None, None):
                seen.setdefault((limits.target, limits.account), limits)
        return sorted(seen.values(), key=lambda a: (a.target, a.account))


def _project_limit(budget: ProjectBudget | None, period: Period) -> float | None:
    if budget is None:
        return None
    return budget.day if period == "day" else budget.month


def _amount(rows: list[dict[str, Any]], **match: str) -> float:
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return float(row["amount"])
    return 0.0


def _figure(limit: float | None, spent: float, period: str) -> dict[str, Any]:
    return {
        "period": period,
        "limit": limit,
        "spent": spent,
        "reached": limit is not None and spent >= limit,
    }
