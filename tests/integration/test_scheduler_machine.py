"""The scheduler against a simple model (issue 37): a hypothesis state machine drives the
real queue (the Lua scripts on a real Redis, two stores as two serve processes) and the
real round (``window.lua``, :func:`aigcq.scheduler.fair.inputs`,
:func:`aigcq.scheduler.policy.plan_round`, claims by id with the user limit) through
submits with users and priority credit, workflow pauses and resumes, rounds, ends and
machine failures; after every step it checks:

* no task that could start waits while a slot is free (its workflow not paused, its user
  below ``AIGCQ_USER_MAX_RUNNING``, its project below its ``max``);
* no cap is exceeded (a user's limit, a project's ``max``);
* inside one tenant the credit orders: nothing claimed ranks after a runnable task of its
  own tenant left waiting;
* usage equals the GPU time run: each project's record is the time its ended runs ran
  plus the mean charged for each still running (no decay: a half-life of ~30,000 years).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

import orjson
import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from aigcq.config import ProjectShare, Settings
from aigcq.domain import Ordering, TaskState
from aigcq.queue.store import TaskStore
from aigcq.scheduler import fair
from aigcq.scheduler.dispatch import key_head
from aigcq.scheduler.policy import RESCUE_MAX, plan_round

PREFIX = "m"
QUEUES = [("p1", "comfyui"), ("p2", "comfyui")]
SLOTS = 3
USER_LIMIT = 1
SHARES = {"p2": ProjectShare(max=2)}
HALF_LIFE = 1e12
DEFAULT_RUN = 10.0
USERS = ["", "u1", "u2"]
WORKFLOWS = ["w1", "w2"]


@dataclass
class Model:
    waiting: dict[str, tuple[str, str, str, float]] = field(default_factory=dict)
    running: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    #: project -> GPU-seconds its ended runs ran
    ran: dict[str, float] = field(default_factory=dict)

    def user_running(self, project: str, user: str) -> int:
        return sum(1 for p, u, _ in self.running.values() if (p, u) == (project, user))

    def project_running(self, project: str) -> int:
        return sum(1 for p, _, _ in self.running.values() if p == project)

    def runnable(self, task_id: str) -> bool:
        project, user, workflow, _ = self.waiting[task_id]
        if workflow in self.paused:
            return False
        if user and self.user_running(project, user) >= USER_LIMIT:
            return False
        ceiling = SHARES.get(project)
        return not (ceiling and ceiling.max is not None and
                    self.project_running(project) >= ceiling.max)  # fmt: skip


class SchedulerMachine(RuleBasedStateMachine):
    redis_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.redis = aioredis.Redis.from_url(self.redis_url, decode_responses=True)
        self.run(self.redis.flushall())
        self.stores = [
            TaskStore(self.redis, PREFIX, retention_s=600, outbox_retention_s=600) for _ in "ab"
        ]
        for store in self.stores:
            store.usage_terms = f"{HALF_LIFE!r} {DEFAULT_RUN!r}"
        self.settings = Settings(user_max_running=USER_LIMIT, share_half_life_s=HALF_LIFE)
        self.model = Model()
        self.count = 0

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        for store in self.stores:
            self.run(store.aclose())
        self.run(self.redis.aclose())
        self.loop.close()

    @rule(
        project=st.sampled_from([q[0] for q in QUEUES]),
        user=st.sampled_from(USERS),
        workflow=st.sampled_from(WORKFLOWS),
        credit=st.sampled_from([0.0, 0.0, 60.0]),
        on=st.integers(0, 1),
    )
    def submit(self, project: str, user: str, workflow: str, credit: float, on: int) -> None:
        self.count += 1
        task_id = f"t{self.count}"
        self.run(
            self.stores[on].submit(
                task_id, aigc=project, platform="comfyui", backend_id="b",
                payload={"workflowId": workflow, "nodeInfoList": []},
                ordering=Ordering(user=user, credit_s=credit),
            )
        )  # fmt: skip
        self.model.waiting[task_id] = (project, user, workflow, time.time() - credit)

    @rule(workflow=st.sampled_from(WORKFLOWS), paused=st.booleans())
    def pause(self, workflow: str, paused: bool) -> None:
        about = orjson.dumps({"since": 1}) if paused else None
        changed = self.run(self.stores[0].pause_workflow(workflow, about))
        assert changed == (paused != (workflow in self.model.paused))
        if paused:
            self.model.paused.add(workflow)
        else:
            self.model.paused.discard(workflow)

    @rule(on=st.integers(0, 1))
    def round(self, on: int) -> None:
        store, free = self.stores[on], SLOTS - len(self.model.running)
        if free <= 0:
            return
        claimed = self.run(self._round(store, free))
        for task_id, attempt in claimed:
            project, user, _, _ = self.model.waiting.pop(task_id)
            self.model.running[task_id] = (project, user, attempt)
        assert self.model.project_running("p2") <= 2
        for project, user, _ in self.model.running.values():
            assert not user or self.model.user_running(project, user) <= USER_LIMIT
        if len(claimed) < free:
            left = [t for t in self.model.waiting if self.model.runnable(t)]
            assert not left, f"{left} wait while {free - len(claimed)} slot(s) are free"
        self._credit_stays_inside_tenants(claimed)

    async def _round(self, store: TaskStore, free: int) -> list[tuple[str, int]]:
        window = await store.reads.window(
            QUEUES, key_head(self.settings, free, 0), "bridge", dated=RESCUE_MAX,
            busy_max=0, user_limit=USER_LIMIT, users_max=free + 1,
        )  # fmt: skip
        now = time.time()
        given = fair.inputs(window, free=free, free_elsewhere=0, settings=self.settings,
                            keys=store.keys, now=now, projects=SHARES)  # fmt: skip
        decision = plan_round(given.tasks, given.pool, given.shares, {}, now,
                              fair.tuning(self.settings))  # fmt: skip
        out = []
        for queue, ids in decision.internal.items():
            for c in await store.claim(*queue, "bridge", cap=-1, n=len(ids), deadline_s=600,
                                       ids=ids, user_limit=USER_LIMIT):  # fmt: skip
                await store.mark_running(c.task_id, c.attempt, "", deadline_s=600,
                                         kind="callback")  # fmt: skip
                out.append((c.task_id, c.attempt))
        return out

    def _credit_stays_inside_tenants(self, claimed: list[tuple[str, int]]) -> None:
        """Nothing claimed ranks after a task of its own tenant and workflow left waiting
        that could have run (the same key: the same capability and pause)."""
        for task_id, _ in claimed:
            project, user, _ = self.model.running[task_id]
            rank = self._rank(task_id)
            for other, (p, u, _w, r) in self.model.waiting.items():
                if (p, u) == (project, user) and self.model.runnable(other):
                    assert r >= rank - 1e-3 or _w != self._workflow(task_id), (task_id, other)

    def _rank(self, task_id: str) -> float:
        created, credit = self.run(
            self.redis.hmget(f"{PREFIX}:task:{task_id}", "created", "credit")
        )
        return float(created) - float(credit or 0)

    def _workflow(self, task_id: str) -> str:
        return str(self.run(self.redis.hget(f"{PREFIX}:task:{task_id}", "workflowId")))

    @precondition(lambda self: bool(self.model.running))
    @rule(data=st.data(), machine_failure=st.booleans(), on=st.integers(0, 1))
    def end(self, data: st.DataObject, machine_failure: bool, on: int) -> None:
        task_id = data.draw(st.sampled_from(sorted(self.model.running)))
        project, user, attempt = self.model.running.pop(task_id)
        store = self.stores[on]
        if machine_failure:  # back to waiting, its run so far counted
            assert self.run(store.requeue_for_retry(task_id, attempt, "machine failure"))
            _, _, workflow, _ = (project, user, self._workflow(task_id), 0.0)
            self.model.waiting[task_id] = (project, user, workflow, self._rank(task_id))
        else:
            done = self.run(store.finish(task_id, TaskState.SUCCESS, result={},
                                         from_attempt=attempt))  # fmt: skip
            assert done.applied
        started, updated = self.run(
            self.redis.hmget(f"{PREFIX}:task:{task_id}", "started", "updated")
        )
        self.model.ran[project] = self.model.ran.get(project, 0.0) + float(updated) - float(started)

    @invariant()
    def users_index_is_the_ready_keys_by_usage(self) -> None:
        """Each queue's users index holds exactly the users of its ready keys, each with
        its ready keys, in the order of their usage (those who never ran first)."""
        for project, platform in QUEUES:
            ready = self.run(self.redis.zrange(f"{PREFIX}:ready:{project}:{platform}", 0, -1))
            by_user: dict[str, set[str]] = {}
            for key in ready:
                by_user.setdefault(orjson.loads(key)[0], set()).add(key)
            users = self.run(self.redis.zrange(f"{PREFIX}:rusers:{project}:{platform}", 0, -1))
            assert set(users) == set(by_user), (project, users, by_user)
            for user, keys in by_user.items():
                mine = f"{PREFIX}:ruready:{project}:{platform}:{user}"
                assert set(self.run(self.redis.zrange(mine, 0, -1))) == keys
            usage = [self._user_usage(project, u) for u in users]
            assert usage == sorted(usage), (project, users, usage)

    def _user_usage(self, project: str, user: str) -> float:
        raw = self.run(self.redis.get(f"{PREFIX}:usage:{project}:user:{user}")) if user else None
        return float(raw.split()[0]) if raw else 0.0

    @invariant()
    def usage_is_the_gpu_time_run(self) -> None:
        for project, _ in QUEUES:
            raw = self.run(self.redis.get(f"{PREFIX}:usage:{project}"))
            value = float(raw.split()[0]) if raw else 0.0
            runs = self.run(self.redis.hgetall(f"{PREFIX}:runs"))
            expected = self.model.ran.get(project, 0.0)
            for task_id, (p, _, _) in self.model.running.items():
                if p == project:
                    expected += self._charged(task_id, runs)
            assert math.isclose(value, expected, abs_tol=1e-6), (project, value, expected)

    def _charged(self, task_id: str, runs: dict[str, str]) -> float:
        gpu = self.run(self.redis.hget(f"{PREFIX}:task:{task_id}", "gpu"))
        return float(gpu.split()[0])


def test_the_scheduler_keeps_its_invariants(redis_url: str) -> None:
    SchedulerMachine.redis_url = redis_url
    state_machine = SchedulerMachine.TestCase
    state_machine.settings = settings(
        max_examples=25,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    state_machine().runTest()
