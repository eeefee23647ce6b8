"""Reconciliation: each paid account's live tasks as its platform counts them and as we do.

Every ``AIGCQ_RECONCILE_INTERVAL_S`` one process of the fleet (the one that takes the lease,
``Keys.reconcile_lease``, held for the interval) asks each paid account whose platform can
say (RunningHub's ``accountStatus``, its key spelt ``apikey``) how many tasks it runs or
queues (``currentTaskCounts``, *theirs*) and its balance (``remainCoins``, what a balance
floor reads, :mod:`.budgets`), and counts *ours*: the account's tasks in flight (the running
sets of every project using its key: dispatching, a create whose answer is unknown,
running) and its orphans (remote tasks we no longer want, creates with no remote id yet).
What it learnt is kept in ``Keys.paid_account`` (``theirs``, ``ours``, ``drift`` = theirs -
ours, ``driftSince``, ``remainCoins``, ``polledAt``, ``suspects``, ``error``), which every
process shows (metrics, the admin snapshot, the dashboard, ``aigcq status``).

* The platform counts more: tasks run there that we do not count (a create we took for
  lost, another client of the key). The suspects are named (logged, and kept in the
  account's record): our creates on the account whose outcome is unknown (running with a
  create intent and no remote id, orphans ``create:<id>``), the likeliest to be those
  tasks. Once it has lasted ``AIGCQ_RECONCILE_GRACE_S`` (and with ``AIGCQ_RECONCILE_STOP``)
  each project on the key gets an automatic hold (``hold:drift:<AIGC>/<target>``,
  :mod:`.pauses`): no new create goes to the account. The first poll that no longer sees
  more lifts it.
* We count more: a record of ours may be stale (a lost webhook). Each of our running
  remote tasks on the account is asked about (its status query); one the platform proves
  ended (a result or a failure) is settled with that outcome, as its webhook would have
  (:meth:`aigcq.scheduler.silence.SilentTasks.ask`); orphans are the orphan checks'.

A poll that fails (unreachable, an unusable answer) is logged and the account asked again
after a back-off (the interval times 2, 4, … up to :data:`MAX_BACKOFF` intervals); nothing
else changes then, and the loop goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from redis.typing import EncodableT, FieldT

from aigcq.domain import TaskState
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import every
from aigcq.plumbing.text import text
from aigcq.runtime import Runtime
from aigcq.scheduler.pauses import HOLD_DRIFT, PauseKind, Pauses, hold_name
from aigcq.scheduler.silence import SilentTasks

log = logging.getLogger(__name__)

#: the longest back-off after failed polls, in intervals
MAX_BACKOFF = 10
#: suspects named per account at most
SUSPECTS = 20
#: the interval a process looks for the lease at while reconciliation is off (s)
IDLE_S = 60.0


@dataclass(frozen=True, slots=True)
class PaidAccount:
    """One paid account (a key on a paid target) and the queues that use it."""

    target: str
    account: str  # its key's digest (PlatformAdapter.account_id)
    apikey: str
    queues: tuple[tuple[str, str], ...]  # (AIGC, platform)

    @property
    def projects(self) -> list[str]:
        return sorted({aigc for aigc, _ in self.queues})


def paid_accounts(rt: Runtime, *, polled_only: bool = False) -> list[PaidAccount]:
    """Every paid account ``model.json`` configures, once per key and target
    (``polled_only``: those whose platform can say what the account runs)."""
    found: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for aigc, platform in rt.config.queues():
        adapter = rt.platforms.adapter_for(platform)
        apikey = rt.apikey(aigc, platform)
        if adapter is None or not adapter.paid or not apikey:
            continue
        if polled_only and adapter.running_request(apikey) is None:
            continue
        found.setdefault((adapter.name, apikey), []).append((aigc, platform))
    return [
        PaidAccount(target, rt.platforms.adapters[target].account_id(key), key, tuple(queues))
        for (target, key), queues in sorted(found.items())
    ]


class Reconciler:
    """Compares each polled account's count with ours (:meth:`reconcile`, under the
    fleet's lease every interval) and reads what it found (:meth:`view`)."""

    def __init__(self, silent: SilentTasks) -> None:
        self.silent = silent
        self.rt: Runtime = silent.rt
        self.pauses = Pauses(self.rt)
        self.owner = f"{id(self):x}-{time.time()}"

    async def run(self) -> None:
        interval = self.rt.settings.reconcile_interval_s
        await every(interval or IDLE_S, self.tick, log, "reconciling the paid accounts")

    async def tick(self) -> bool:
        """Reconcile if this process takes the interval's lease; whether it did."""
        interval = self.rt.settings.reconcile_interval_s
        if interval <= 0:
            return False
        lease = self.rt.store.keys.reconcile_lease
        px = max(1, int(interval * 1000 * 0.9))  # a little short: the next tick takes it
        if not await self.rt.redis.set(lease, self.owner, nx=True, px=px):
            return False
        await self.reconcile()
        return True

    async def reconcile(self) -> int:
        """One pass over the polled accounts; how many answered."""
        answered = 0
        for account in paid_accounts(self.rt, polled_only=True):
            answered += await self.account(account)
        return answered

    async def account(self, a: PaidAccount) -> int:
        """Poll one account (unless it backs off) and act on the drift; 1: it answered."""
        key, now = self.rt.store.keys.paid_account(a.target, a.account), time.time()
        record = {text(k): text(v) for k, v in (await self.rt.redis.hgetall(key)).items()}
        if now < float(record.get("retryAt") or 0):
            return 0
        adapter = self.rt.platforms.adapters[a.target]
        state = await self.rt.platforms.account(adapter, a.apikey)
        if state is None:
            await self._failed(a, key, record, now)
            return 0
        ours, suspects, stale = await self._ours(a)
        drift = state.tasks - ours
        since = (float(record.get("driftSince") or 0) or now) if drift > 0 else 0.0
        fields: dict[FieldT, EncodableT] = {
            "target": a.target,
            "account": a.account,
            "projects": ",".join(a.projects),
            "theirs": state.tasks,
            "ours": ours,
            "drift": drift,
            "driftSince": since,
            "polledAt": now,
            "suspects": orjson.dumps(suspects if drift > 0 else []).decode(),
            "failures": 0,
            "retryAt": 0,
            "error": "",
        }
        if state.remain_coins is not None:
            fields["remainCoins"] = state.remain_coins
        await self.rt.redis.hset(key, mapping=fields)
        if drift > 0:
            await self._more_there(a, drift, now - since, suspects)
        else:
            await self._hold(a, False, "")
        if drift < 0:
            await self._more_here(a, -drift, stale)
        return 1

    async def _failed(self, a: PaidAccount, key: str, record: dict[str, str], now: float) -> None:
        failures = int(record.get("failures") or 0) + 1
        wait_s = self.rt.settings.reconcile_interval_s * min(2**failures, MAX_BACKOFF)
        error = "no usable answer to the account status query"
        await self.rt.redis.hset(
            key,
            mapping={"failures": failures, "retryAt": now + wait_s, "error": error,
                     "target": a.target, "account": a.account},
        )  # fmt: skip
        log.warning(
            "reconcile %s/%s: %s (%d in a row); asked again in %.0f s",
            a.target,
            a.account,
            error,
            failures,
            wait_s,
        )

    async def _ours(self, a: PaidAccount) -> tuple[int, list[dict[str, str]], list[str]]:
        """Our count of the account's live tasks, the suspects (creates whose outcome is
        unknown) and our running remote tasks (what a stale record would be)."""
        keys, redis, target = self.rt.store.keys, self.rt.redis, a.target
        pipe = redis.pipeline(transaction=False)
        for aigc in a.projects:
            pipe.zrange(keys.running(aigc, target), 0, -1)
            pipe.zrange(keys.orphans(aigc, target), 0, -1)
        listed = await pipe.execute()
        running = [text(t) for members in listed[::2] for t in members]
        orphans = [text(o) for members in listed[1::2] for o in members]
        pipe = redis.pipeline(transaction=False)
        for task_id in running:
            pipe.hmget(keys.task(task_id), "status", "remoteTaskId", "createId")
        for remote in orphans:
            pipe.hmget(keys.orphan(remote), "taskId", "createAt")
        rows = await pipe.execute()
        suspects, stale = [], []
        for task_id, (status, remote, create_id) in zip(running, rows, strict=False):
            if create_id and not remote:
                suspects.append({"taskId": task_id, "createId": text(create_id), "as": "running"})
            elif remote and text(status or "") == TaskState.RUNNING.value:
                stale.append(task_id)
        for remote, (task_id, _) in zip(orphans, rows[len(running) :], strict=True):
            if remote.startswith("create:"):
                suspects.append(
                    {"taskId": text(task_id or ""), "createId": remote[7:], "as": "orphan"}
                )
        return len(running) + len(orphans), suspects[:SUSPECTS], stale

    async def _more_there(
        self, a: PaidAccount, drift: int, lasted_s: float, suspects: list[dict[str, str]]
    ) -> None:
        grace_s = self.rt.settings.reconcile_grace_s
        named = ", ".join(s["taskId"] for s in suspects) or "none of ours"
        over = lasted_s >= grace_s
        stop = over and self.rt.settings.reconcile_stop
        log.warning(
            "reconcile %s/%s: the platform counts %d task(s) more than we do, for %.0f s%s; "
            "suspects: %s",
            a.target,
            a.account,
            drift,
            lasted_s,
            " (past the grace: no new create)" if stop else "",
            named,
            extra=ctx(task=suspects[0]["taskId"] if suspects else None),
        )
        if stop:
            note = f"the platform counts {drift} task(s) more than we do; suspects: {named}"
            await self._hold(a, True, note)

    async def _hold(self, a: PaidAccount, held: bool, note: str) -> None:
        """Hold (or lift the hold of) every project's creates on the account."""
        for aigc in a.projects:
            await self.pauses.set(PauseKind.HOLD, hold_name(HOLD_DRIFT, aigc, a.target), held, note)

    async def _more_here(self, a: PaidAccount, drift: int, stale: Iterable[str]) -> None:
        """We count more: each of our running remote tasks is asked about; one the platform
        proves ended settles."""
        adapter = self.rt.platforms.adapters[a.target]
        why = f"the platform counts {drift} task(s) fewer on its account than we do"
        settled = 0
        for task_id in stale:
            settled += await self.silent.ask(task_id, adapter, why)
        log.info(
            "reconcile %s/%s: we count %d task(s) more than the platform; %d settled as it "
            "says they ended",
            a.target,
            a.account,
            drift,
            settled,
        )

    async def view(self) -> list[dict[str, Any]]:
        """What the last polls found, per polled account (theirs, ours, drift …)."""
        rows = []
        for a in paid_accounts(self.rt, polled_only=True):
            key = self.rt.store.keys.paid_account(a.target, a.account)
            h = {text(k): text(v) for k, v in (await self.rt.redis.hgetall(key)).items()}
            rows.append(account_row(a, h))
        return rows


def account_row(a: PaidAccount, h: dict[str, str]) -> dict[str, Any]:
    """An account's record as the admin API shows it (None: not polled yet)."""

    def number(name: str) -> float | None:
        return float(h[name]) if h.get(name) not in (None, "") else None

    theirs, ours, drift = number("theirs"), number("ours"), number("drift")
    return {
        "target": a.target,
        "account": a.account,
        "projects": a.projects,
        "theirs": None if theirs is None else int(theirs),
        "ours": None if ours is None else int(ours),
        "drift": None if drift is None else int(drift),
        "driftSince": number("driftSince") or None,
        "remainCoins": number("remainCoins"),
        "polledAt": number("polledAt"),
        "suspects": orjson.loads(h["suspects"]) if h.get("suspects") else [],
        "failures": int(number("failures") or 0),
        "error": h.get("error", ""),
    }
