"""The task state machine, driven for real: a hypothesis state machine makes random moves
(submit, claim, begin a create, mark running, postpone, retarget, the four requeues,
promote, finish, withdraw, expire, retry, replay) through :class:`TaskStore`, that is through
the Lua scripts of :mod:`aigcq.queue`, on a real Redis, with fresh and stale attempts. After
every step, for every task:

- it is in exactly one place: waiting (in its queue and its key's set, or backing off in
  the delayed set), in flight (in the ``inflight`` index and its target's running set, scored by the
  deadline its hash holds) or terminal (in none of them);
- its state changed only as :data:`aigcq.domain.TRANSITIONS` allows the move made (a move of
  ``KEEPS_STATE`` leaves it where it was), and only when the store says the move applied;
- the tasks the move was not about did not change at all.

Bounded (80 runs of up to 50 moves on four tasks, about 7 s) so that a policy change in a
script gets a second-scale test that explores orders no hand-written test lists."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Iterable
from typing import Any, ClassVar, TypeVar

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from redis.asyncio import Redis

from aigcq.domain import KEEPS_STATE, LIVE_STATES, TRANSITIONS, Move, TaskState
from aigcq.queue.store import TaskStore

AIGC, PLATFORM = "p", "comfyui"
TARGETS = ("gpu", "paid")
IDS = [f"t{i}" for i in range(4)]
TASK = st.sampled_from(IDS)
TARGET = st.sampled_from(TARGETS)
#: the live attempt, or one before it (a late report of an earlier dispatch)
STALE = st.booleans()
DELAY = st.sampled_from([0.0, 30.0])
ERROR = {"code": "X", "msg": "test"}
#: the set of the tasks' key (no end user, workflow "w": ``bykey`` in ``_prelude.lua``)
WAIT_KEY = f"q:wq:{AIGC}:{PLATFORM}:" + json.dumps(["", "w"], separators=(",", ":"))

_T = TypeVar("_T")


class TaskLives(RuleBasedStateMachine):
    redis_url: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.redis = Redis.from_url(self.redis_url, decode_responses=True)
        self.run(self.redis.flushall())
        self.store = TaskStore(self.redis, "q", retention_s=600, outbox_retention_s=600)
        self.store.paid_targets = "paid"
        self.keys = self.store.keys
        #: each task's state as last seen (absent: never submitted)
        self.seen: dict[str, TaskState] = {}

    def teardown(self) -> None:
        self.run(self.store.aclose())
        self.run(self.redis.aclose())
        self.loop.close()

    def run(self, coro: Awaitable[_T]) -> _T:
        async def wrapped() -> _T:
            return await coro

        return self.loop.run_until_complete(wrapped())

    # ---- what a step did --------------------------------------------------------------

    def states(self) -> dict[str, TaskState]:
        async def read() -> list[Any]:
            pipe = self.redis.pipeline(transaction=False)
            for task_id in IDS:
                pipe.hget(self.keys.task(task_id), "status")
            return list(await pipe.execute())

        return {i: TaskState(s) for i, s in zip(IDS, self.run(read()), strict=True) if s}

    def moved(self, moves: Iterable[Move], about: Iterable[str], applied: bool | None) -> None:
        """After one store call: each task ``about`` that changed state did so by one of
        ``moves``; ``applied`` False: none changed; the others changed not at all."""
        moves, about = tuple(moves), set(about)
        now = self.states()
        for task_id in IDS:
            before, after = self.seen.get(task_id), now.get(task_id)
            if task_id not in about or applied is False:
                assert after == before, f"{task_id}: {before} -> {after}, not moved"
                continue
            if after == before:
                continue
            assert after is not None, f"{task_id} vanished"
            allowed = [m for m in moves if _allows(m, before, after)]
            assert allowed, f"{task_id}: {before} -> {after} by none of {moves}"
        self.seen = now

    def pick(self, data: st.DataObject, move: Move) -> str:
        """Mostly a task ``move`` may start from, when there is one; else any (which the
        store must refuse, changing nothing)."""
        sources = TRANSITIONS[move][0] | (
            {TaskState.FAILED} if move is Move.FINISH else set()  # a late success
        )
        fit = [i for i in IDS if self.seen.get(i) in sources]
        if fit and data.draw(st.integers(0, 4), label="fits"):
            return data.draw(st.sampled_from(fit), label="task")
        return data.draw(TASK, label="task")

    def attempt(self, task_id: str, stale: bool) -> int:
        current = int(self.run(self.redis.hget(self.keys.task(task_id), "attempt")) or 0)
        return current - 1 if stale else current

    def target(self, task_id: str) -> str:
        return str(self.run(self.redis.hget(self.keys.task(task_id), "target")) or "")

    # ---- the moves ----------------------------------------------------------------------

    @initialize()
    def submitted(self) -> None:
        for task_id in IDS[:3]:
            self.submit(task_id)

    @rule(task_id=TASK)
    def submit(self, task_id: str) -> None:
        payload = {"workflowId": "w"}
        done = self.run(
            self.store.submit(
                task_id, aigc=AIGC, platform=PLATFORM, backend_id="b", payload=payload
            )
        )
        self.moved([Move.SUBMIT], [task_id], done.created)

    @rule(to=TARGET, n=st.integers(1, 3), cap=st.sampled_from([-1, 2]))
    def claim(self, to: str, n: int, cap: int) -> None:
        claimed = self.run(self.store.claim(AIGC, PLATFORM, to, cap=cap, n=n, deadline_s=60))
        ids = [c.task_id for c in claimed]
        assert len(ids) == len(set(ids)) <= n
        assert all(self.seen.get(i) is TaskState.PENDING for i in ids)
        self.moved([Move.CLAIM], ids, bool(ids))
        assert all(self.seen[i] is TaskState.DISPATCHING for i in ids)

    @rule(data=st.data(), stale=STALE)
    def begin_create(self, data: st.DataObject, stale: bool) -> None:
        task_id = self.pick(data, Move.BEGIN_CREATE)
        attempt = self.attempt(task_id, stale)
        begun = self.run(
            self.store.begin_create(task_id, attempt, f"c-{task_id}-{attempt}", deadline_s=60)
        )
        self.moved([Move.BEGIN_CREATE], [task_id], bool(begun))

    @rule(data=st.data(), stale=STALE)
    def mark_running(self, data: st.DataObject, stale: bool) -> None:
        task_id = self.pick(data, Move.MARK_RUNNING)
        attempt = self.attempt(task_id, stale)
        where = (AIGC, PLATFORM, "paid") if self.target(task_id) == "paid" else None
        marked = self.run(
            self.store.mark_running(
                task_id, attempt, f"r-{task_id}-{attempt}", deadline_s=60, kind="poll", where=where
            )
        )
        self.moved([Move.MARK_RUNNING], [task_id], bool(marked))

    @rule(data=st.data(), stale=STALE)
    def postpone(self, data: st.DataObject, stale: bool) -> None:
        task_id = self.pick(data, Move.POSTPONE)
        delay = self.run(self.store.postpone(task_id, self.attempt(task_id, stale), max_delay_s=5))
        self.moved([Move.POSTPONE], [task_id], delay > 0)

    @rule(data=st.data(), stale=STALE, to=TARGET)
    def retarget(self, data: st.DataObject, stale: bool, to: str) -> None:
        task_id = self.pick(data, Move.RETARGET)
        attempt, source = self.attempt(task_id, stale), self.target(task_id)
        code = self.run(self.store.retarget(task_id, attempt, source, to, cap=-1, deadline_s=60))
        self.moved([Move.RETARGET], [task_id], code == 1)

    @rule(data=st.data(), stale=STALE, delay=DELAY, held=st.booleans())
    def requeue_unrun(self, data: st.DataObject, stale: bool, delay: float, held: bool) -> None:
        task_id = self.pick(data, Move.REQUEUE_UNRUN)
        attempt = self.attempt(task_id, stale)
        done = self.run(
            self.store.requeue_unrun(task_id, attempt, "full", delay_s=delay, held=held)
        )
        self.moved([Move.REQUEUE_UNRUN], [task_id], done)

    @rule(data=st.data(), stale=STALE)
    def requeue_unsent(self, data: st.DataObject, stale: bool) -> None:
        task_id = self.pick(data, Move.REQUEUE_UNSENT)
        attempt = self.attempt(task_id, stale)
        done = self.run(self.store.requeue_unsent(task_id, attempt, "stopping"))
        self.moved([Move.REQUEUE_UNSENT], [task_id], done)

    @rule(data=st.data(), stale=STALE, delay=DELAY, ended=st.booleans())
    def requeue_for_retry(
        self, data: st.DataObject, stale: bool, delay: float, ended: bool
    ) -> None:
        task_id = self.pick(data, Move.REQUEUE_FOR_RETRY)
        attempt = self.attempt(task_id, stale)
        done = self.run(
            self.store.requeue_for_retry(task_id, attempt, "lost", delay_s=delay, ended=ended)
        )
        self.moved([Move.REQUEUE_FOR_RETRY], [task_id], done)

    @rule(data=st.data(), stale=STALE)
    def requeue_handed_back(self, data: st.DataObject, stale: bool) -> None:
        task_id = self.pick(data, Move.REQUEUE_HANDED_BACK)
        attempt = self.attempt(task_id, stale)
        remote = f"r-{task_id}-{attempt}"
        done = self.run(self.store.requeue_handed_back(task_id, attempt, remote, "degraded"))
        self.moved([Move.REQUEUE_HANDED_BACK], [task_id], done)

    @rule(data=st.data())
    def promote(self, data: st.DataObject) -> None:
        task_id = self.pick(data, Move.PROMOTE)
        promoted = self.run(self.store.promote(task_id))
        self.moved([Move.PROMOTE], [task_id], promoted)

    @rule()
    def promote_delayed(self) -> None:
        self.run(self.store.promote_delayed())
        self.moved([Move.PROMOTE], IDS, None)

    @rule(
        data=st.data(),
        state=st.sampled_from(sorted(TRANSITIONS[Move.FINISH][1])),
        stale=STALE,
        about_attempt=st.booleans(),
        fenced=st.booleans(),
        ended=st.booleans(),
    )
    def finish(
        self,
        data: st.DataObject,
        state: TaskState,
        stale: bool,
        about_attempt: bool,
        fenced: bool,
        ended: bool,
    ) -> None:
        task_id = self.pick(data, Move.FINISH)
        attempt = self.attempt(task_id, stale) if about_attempt else None
        done = self.run(
            self.store.finish(
                task_id,
                state,
                result={"ok": True} if state is TaskState.SUCCESS else None,
                error=None if state is TaskState.SUCCESS else ERROR,
                from_attempt=attempt,
                fenced=fenced and attempt is not None,
                ended=ended,
            )
        )
        # the success of an attempt a failure gave up on may still win (LATE_SUCCESS)
        self.moved([Move.FINISH, Move.LATE_SUCCESS], [task_id], None)
        if done.applied:
            assert self.seen[task_id] is state

    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        task_id = self.pick(data, Move.WITHDRAW)
        done = self.run(self.store.withdraw(task_id, error=ERROR, note="taken back"))
        self.moved([Move.WITHDRAW], [task_id], done)

    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        task_id = self.pick(data, Move.EXPIRE)
        done = self.run(self.store.expire(task_id, error=ERROR, message={}, note="late"))
        self.moved([Move.EXPIRE], [task_id], done.applied)

    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        task_id = self.pick(data, Move.RETRY)
        done = self.run(self.store.retry(task_id))
        self.moved([Move.RETRY], [task_id], done.applied)

    @rule(data=st.data())
    def deliver_kept(self, data: st.DataObject) -> None:
        task_id = self.pick(data, Move.REPLAY_RESULT)
        done = self.run(self.store.deliver_kept(task_id, "kept"))
        self.moved([Move.REPLAY_RESULT], [task_id], done.applied)

    # ---- where every task is ------------------------------------------------------------

    @invariant()
    def each_task_is_in_exactly_one_place(self) -> None:
        places = self.run(self._places())
        for task_id in IDS:
            state = self.seen.get(task_id)
            place = places[task_id]
            queued, in_key, delayed, inflight, running, deadline = place
            where = f"{task_id} ({state}): queued {queued}, in its key {in_key}, delayed "
            where += f"{delayed}, inflight {inflight}, running in {running}, deadline {deadline}"
            assert queued == in_key, where  # the queue and its key hold the same tasks
            if state is TaskState.PENDING:  # waiting: queued, or backing off
                assert (queued is not None) != (delayed is not None), where
                assert inflight is None and running == [], where
            elif state in LIVE_STATES:  # dispatching or running: in flight
                assert queued is None and delayed is None, where
                assert inflight is not None and deadline is not None, where
                assert abs(inflight - deadline) < 1e-3, where
                assert len(running) == 1 and running[0][1] == inflight, where
                assert running[0][0] == self.target(task_id), where
            else:  # terminal, or never submitted
                assert state is None or state.terminal, where
                assert place[:5] == (None, None, None, None, []), where

    async def _places(self) -> dict[str, tuple[Any, ...]]:
        """Each task's score in its queue, in its key's set (one end user's tasks of one
        workflow, ``_prelude.lua``), in the delayed set and in ``inflight``; the running
        sets it is in; its hash's deadline."""
        pipe = self.redis.pipeline(transaction=False)
        for task_id in IDS:
            pipe.zscore(self.keys.wait(AIGC, PLATFORM), task_id)
            pipe.zscore(WAIT_KEY, task_id)
            pipe.zscore(self.keys.delayed, task_id)
            pipe.zscore(self.keys.inflight, task_id)
            for target in TARGETS:
                pipe.zscore(self.keys.running(AIGC, target), task_id)
            pipe.hget(self.keys.task(task_id), "deadline")
        replies = iter(await pipe.execute())
        places = {}
        for task_id in IDS:
            queued, in_key, delayed, inflight = (next(replies) for _ in range(4))
            running = [(t, s) for t in TARGETS if (s := next(replies)) is not None]
            deadline = next(replies)
            places[task_id] = (
                queued,
                in_key,
                delayed,
                inflight,
                running,
                float(deadline) if deadline else None,
            )
        return places


def _allows(move: Move, before: TaskState | None, after: TaskState) -> bool:
    sources, targets = TRANSITIONS[move]
    if move in KEEPS_STATE:
        return before == after and before in sources
    return (before in sources if sources else before is None) and after in targets


def test_every_move_keeps_a_task_in_one_place_and_follows_transitions(redis_url: str) -> None:
    TaskLives.redis_url = redis_url
    run_state_machine_as_test(
        TaskLives,
        settings=settings(
            max_examples=80,
            stateful_step_count=50,
            deadline=None,
            # no shrinking: a failing run prints its steps as they ran, within the test's
            # timeout (shrinking runs of Redis round trips takes minutes)
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
