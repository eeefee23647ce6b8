"""A task's life as one OpenTelemetry trace (docs/tracing.md), told by the lifecycle.

Each task's trace context is kept with it in Redis (its hash's ``trace`` field: the
``traceparent`` of its ``create`` span), so whichever process moves it continues the same
trace. The spans, all children of that ``create`` span and named as the messaging
semantic conventions name them (``{operation} {destination}``, the destination being
the task's queue ``AIGC:platform``):

* ``create``  its submit (producer), child of the client's ``traceparent`` when it sent one;
* ``wait``    its wait in the queue, from its submit (or its return to waiting) to its claim;
* ``receive`` a dispatch decision (the claim), with its reason (``aigcq.dispatch.reason``:
  own GPU, overflow, deadline rescue, paid first, handed back...) and its target;
* ``process`` an attempt on its target, from its claim to its end, recorded by whichever
  process ends it, its timeline as events; on a paid platform with what it cost
  (``aigcq.cost``, ``aigcq.cost.currency``, ``aigcq.account``). Its span id is derived
  from the task and the attempt, so the bridge continues the trace under it
  (TASK_ASSIGN's ``traceparent``) while it runs;
* ``settle``  the delivery of its result to its client (again on a redelivery).

With tracing off (:data:`aigcq.observability.tracing.ON` false) every method returns at
once; with it on, what needs Redis runs in the background, off the task's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from aigcq.observability import tracing
from aigcq.platforms.base import Cost
from aigcq.plumbing.text import text
from aigcq.queue.store import Claimed
from aigcq.runtime import Runtime
from aigcq.scheduler.spend import charge

log = logging.getLogger(__name__)


def destination(aigc: str, platform: str) -> str:
    """A queue's name on spans: ``AIGC:platform``."""
    return f"{aigc}:{platform}"


#: tasks whose trace a process remembers from its claims (the latest)
KNOWN_MAX = 65536
#: spans being recorded at most (each reads its task from Redis first); more are dropped
JOBS_MAX = 4096

#: a submit's context while tracing is off: no trace to keep
_UNTRACED = contextlib.nullcontext("")


def attempt_parent(trace: str, task_id: str, attempt: int) -> str:
    """The ``traceparent`` of attempt ``attempt``'s ``process`` span ("" if untraced)."""
    if not trace:
        return ""
    return tracing.derived(trace, task_id, "attempt", attempt)


class TaskTraces:
    """Records a task's spans as the lifecycle, the dispatch loop and the delivery see it."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._jobs: set[asyncio.Task[None]] = set()
        #: spans dropped because :data:`JOBS_MAX` were being recorded
        self.dropped = 0
        #: the trace of each task this process claimed lately ("": none): the end of an
        #: attempt, or the delivery, of a task known not to be sampled reads nothing
        self._known: OrderedDict[str, str] = OrderedDict()

    # ---- submit -------------------------------------------------------------------------

    def creating(
        self, task_id: str, queue: tuple[str, str], backend_id: str, parent: str | None
    ) -> contextlib.AbstractContextManager[str]:
        """Around a submit: its ``create`` span (child of ``parent``, the client's
        traceparent, if any); gives the traceparent to keep with the task ("" when off)."""
        return self._creating(task_id, queue, backend_id, parent) if tracing.ON else _UNTRACED

    @contextlib.contextmanager
    def _creating(
        self, task_id: str, queue: tuple[str, str], backend_id: str, parent: str | None
    ) -> Iterator[str]:
        dest = destination(*queue)
        attrs = tracing.messaging(
            "create", "create", dest, task_id, {"aigcq.backend_id": backend_id}
        )
        with tracing.span(
            f"create {dest}", parent, kind="producer", attributes=attrs, root=True
        ) as s:
            trace = tracing.traceparent_of(s) if s is not None else ""
            if trace:  # whether it is sampled, known here without a read
                self._remember(task_id, trace)
            yield trace

    # ---- dispatch -----------------------------------------------------------------------

    def claimed(
        self,
        queue: tuple[str, str],
        target: str,
        tasks: Sequence[Claimed],
        why: str | Callable[[str], str],
        began: float,
    ) -> None:
        """``tasks`` were claimed for ``target`` (a round that began at ``began``) because
        ``why`` (or ``why(taskId)``): each one's wait in its queue, and the decision."""
        if not tracing.ON:
            return
        now, dest = time.time(), destination(*queue)
        for c in tasks:
            self._remember(c.task_id, c.trace)
            if not c.trace:
                continue
            since = c.since or c.created_at
            attrs: dict[str, tracing.Attr] = {
                "messaging.destination.name": dest,
                "aigcq.attempt": c.attempt,
            }
            tracing.record(f"wait {dest}", c.trace, min(since, began), began, attributes=attrs)
            reason = why(c.task_id) if callable(why) else why
            self._decision(c, dest, target, reason, began, now)

    def retargeted(
        self, c: Claimed, queue: tuple[str, str], source: str, target: str, reason: str
    ) -> None:
        """``source`` handed ``c`` back and it moves to ``target`` in the same attempt."""
        if tracing.ON and c.trace:
            now = time.time()
            why = f"overflow from {source}: {reason}"
            self._decision(c, destination(*queue), target, why, now, now)

    def _decision(
        self, c: Claimed, dest: str, target: str, why: str, start: float, end: float
    ) -> None:
        attrs = tracing.messaging(
            "receive",
            "receive",
            dest,
            c.task_id,
            {
                "aigcq.attempt": c.attempt,
                "aigcq.target": target,
                "aigcq.dispatch.reason": why,
            },
        )
        tracing.record(f"receive {dest}", c.trace, start, end, kind="consumer", attributes=attrs)

    @contextlib.contextmanager
    def sending(self, c: Claimed, target: str) -> Iterator[Any]:
        """Around a create sent to paid ``target`` for ``c``: its ``send`` span, a child of
        the attempt's ``process`` span (yields None when not traced)."""
        parent = self.attempt(c)
        if not parent:
            yield None
            return
        attrs = tracing.messaging(
            "send",
            "send",
            target,
            c.task_id,
            {"aigcq.attempt": c.attempt, "aigcq.target": target},
        )
        with tracing.span(f"send {target}", parent, kind="producer", attributes=attrs) as s:
            yield s

    def attempt(self, c: Claimed) -> str:
        """The traceparent handed to the target running ``c``'s attempt ("": untraced)."""
        if not tracing.ON:
            return ""
        return attempt_parent(c.trace, c.task_id, c.attempt)

    # ---- an attempt's end -----------------------------------------------------------------

    def attempt_over(
        self,
        task_id: str,
        attempt: int | None,
        how: str,
        *,
        error: str = "",
        cost: Cost | None = None,
    ) -> None:
        """Attempt ``attempt`` (None: the task's live one) of the task ended (``how``: its
        outcome, e.g. ``success``, ``retry``, ``not run``): its ``process`` span, recorded
        in the background from the task's stored context and timeline."""
        if tracing.ON and self._maybe_sampled(task_id):
            self._spawn(self._attempt_over(task_id, attempt, how, error, cost, time.time()))

    async def _attempt_over(
        self,
        task_id: str,
        attempt: int | None,
        how: str,
        error: str,
        cost: Cost | None,
        end: float,
    ) -> None:
        store = self.rt.store
        fields = await store.mux.command(
            "HMGET", store.keys.task(task_id), "trace", "AIGC", "platform", "target", "attempt"
        )
        trace, aigc, platform, target, live = (text(v) if v is not None else "" for v in fields)
        if not tracing.sampled(trace):
            return  # not recorded: its timeline is not read
        n = attempt if attempt is not None else int(live or 0)
        if n <= 0:
            return
        notes = await store.reads.timeline(task_id)
        mine = [x for x in notes if int(x.get("attempt") or 0) == n]
        started = [x["t"] for x in mine if x.get("state") == "dispatching"]
        start = float(started[0]) if started else end
        target = next((x["target"] for x in reversed(mine) if x.get("target")), target)
        remote = next(
            (x["note"] for x in reversed(mine) if x.get("state") == "running" and x.get("note")),
            "",
        )
        dest = destination(aigc, platform)
        attrs: dict[str, tracing.Attr] = tracing.messaging(
            "process",
            "process",
            dest,
            task_id,
            {"aigcq.attempt": n, "aigcq.target": target, "aigcq.outcome": how},
        )
        if remote:
            attrs["aigcq.remote_id"] = remote
        attrs |= self._cost(aigc, platform, target, cost)
        events = [(str(x.get("state")), float(x["t"]), _note_attrs(x)) for x in mine if x.get("t")]
        tracing.record(
            f"process {dest}",
            trace,
            start,
            end,
            kind="consumer",
            attributes=attrs,
            events=events,
            error=error,
            own=attempt_parent(trace, task_id, n),
        )

    def _cost(
        self, aigc: str, platform: str, target: str, cost: Cost | None
    ) -> dict[str, tracing.Attr]:
        """A paid run's cost attributes (none for our GPUs)."""
        adapter = self.rt.platforms.adapters.get(target)
        if adapter is None or not adapter.paid:
            return {}
        attrs: dict[str, tracing.Attr] = {
            "aigcq.paid": True,
            "aigcq.account": adapter.account_id(self.rt.apikey(aigc, platform)),
        }
        if cost is not None:
            c = charge(cost, self.rt.settings.overflow_price.get(target))
            attrs |= {
                "aigcq.cost": c.amount,
                "aigcq.cost.currency": self.rt.settings.cost_currency,
                "aigcq.cost.estimate": c.estimate,
            }
            if c.coins:
                attrs["aigcq.cost.coins"] = c.coins
            if c.seconds:
                attrs["aigcq.cost.seconds"] = c.seconds
        return attrs

    # ---- delivery -------------------------------------------------------------------------

    def delivered(
        self, backend_id: str, message: dict[str, Any], began: float, *, reconnected: bool
    ) -> None:
        """A task's result ``message`` was written to its client's socket, from ``began``
        to now (``reconnected``: in the first delivery after the client connected: what
        waited for it, or a redelivery of what it had not acknowledged)."""
        task_id = message.get("taskId")
        if tracing.ON and message.get("type") == "result" and self._maybe_sampled(task_id):
            job = self._delivered(backend_id, message, reconnected, began, time.time())
            self._spawn(job)

    async def _delivered(
        self,
        backend_id: str,
        message: dict[str, Any],
        reconnected: bool,
        began: float,
        end: float,
    ) -> None:
        task_id = str(message["taskId"])
        store = self.rt.store
        trace, aigc, platform = (
            text(v) if v is not None else ""
            for v in await store.mux.command(
                "HMGET", store.keys.task(task_id), "trace", "AIGC", "platform"
            )
        )
        if not tracing.sampled(trace):
            return
        dest = destination(aigc, platform)
        attrs = tracing.messaging(
            "deliver",
            "settle",
            dest,
            task_id,
            {
                "aigcq.backend_id": backend_id,
                "aigcq.outbox.id": str(message.get("id", "")),
                "aigcq.status": str(message.get("status", "")),
                "aigcq.delivery.reconnected": reconnected,
            },
        )
        tracing.record(f"settle {dest}", trace, began, end, kind="client", attributes=attrs)

    # ---- plumbing -------------------------------------------------------------------------

    def _remember(self, task_id: str, trace: str) -> None:
        self._known[task_id] = trace
        self._known.move_to_end(task_id)
        if len(self._known) > KNOWN_MAX:
            self._known.popitem(last=False)

    def _maybe_sampled(self, task_id: object) -> bool:
        """Whether ``task_id``'s trace may be sampled (not known here: it may)."""
        if not task_id:
            return False
        trace = self._known.get(str(task_id))
        return trace is None or tracing.sampled(trace)

    def _spawn(self, job: Any) -> None:
        """Record a span in the background; past :data:`JOBS_MAX` being recorded (Redis
        slow to answer their reads) it is dropped, as the SDK's own queue drops spans
        when full: tracing never holds memory a task needs."""
        if len(self._jobs) >= JOBS_MAX:
            job.close()
            self.dropped += 1
            if self.dropped in (1, 100) or self.dropped % 10_000 == 0:
                log.warning("tracing: %d spans dropped, %d being recorded", self.dropped, JOBS_MAX)
            return
        task = asyncio.ensure_future(_quietly(job))
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    async def drain(self) -> None:
        """Wait for the spans being recorded (a process's end, a test)."""
        while self._jobs:
            await asyncio.gather(*list(self._jobs), return_exceptions=True)


def sent(span: Any, outcome: object) -> None:
    """What a paid platform answered a create, on its ``send`` span (if any)."""
    if span is None:
        return
    remote = getattr(outcome, "remote_id", None)
    with contextlib.suppress(Exception):  # tracing never stands in a task's way
        span.set_attribute("aigcq.create.outcome", type(outcome).__name__)
        if remote:
            span.set_attribute("aigcq.remote_id", str(remote))
    if not remote:
        why = getattr(outcome, "reason", "") or getattr(outcome, "message", "")
        tracing.failed(span, f"{type(outcome).__name__}: {why}")


def _note_attrs(note: dict[str, Any]) -> dict[str, tracing.Attr]:
    out: dict[str, tracing.Attr] = {"aigcq.attempt": int(note.get("attempt") or 0)}
    if note.get("target"):
        out["aigcq.target"] = str(note["target"])
    if note.get("note"):
        out["aigcq.note"] = str(note["note"])[:256]
    return out


async def _quietly(job: Any) -> None:
    try:
        await job
    except Exception as exc:  # a span lost is not worth more than a line
        log.debug("a span was not recorded: %r", exc)
