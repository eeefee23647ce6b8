"""After a Redis master change: the tasks whose last writes may have been lost, checked.

A failover (Sentinel's promotion, a managed Redis's DNS switch) or a restart that lost its
data can drop the writes the old master acknowledged last: replication is asynchronous, and
``AIGCQ_REDIS_MIN_REPLICAS`` waits for the replicas only where it matters (a submit, a paid
create's intent, a TASK_END), not after every move.

Each serve process reads the master's ``run_id`` (``INFO server``) and role every
:data:`CHECK_S` s through its pool; a ``run_id`` other than the one it saw last (or a role
that is not ``master``) is a master change, and one pass checks what it may have lost:

* a paid task with a create intent and no record of the platform's answer (no remote id)
  may have been created: it is left running for its webhook (signed for its attempt, which
  settles it) and its deadline (:mod:`.sweeper`, which never sends it again blindly); the
  pass names each one;
* the tasks our bridges run are given to each listener (the hub re-records them with their
  attempts and names those whose record in Redis is older than the bridge's).

Nothing is sent again and nothing is moved by a guess: what the pass finds waits for its
TASK_END or its deadline, which settle it once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aigcq.domain import TaskState
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import every, one_round
from aigcq.runtime import Runtime

log = logging.getLogger(__name__)

#: how often each process reads the master's identity (s)
CHECK_S = 1.0

#: called after a master change, once the pass read the tasks in flight
Listener = Callable[[], Awaitable[None]]


@dataclass(eq=False)
class MasterWatch:
    """Notices a new Redis master and runs the reconcile pass once per change."""

    rt: Runtime
    listeners: list[Listener] = field(default_factory=list)
    #: the master's run_id last seen ('' before the first read)
    seen: str = ""
    changes: int = 0

    async def run(self) -> None:
        what = "reading the Redis master's identity"
        with one_round(log, what):  # at once: a failover in the first second is a change too
            await self.check()
        await every(CHECK_S, self.check, log, what)

    async def check(self) -> bool:
        """Read the master's identity; on a change, reconcile. True: it had changed."""
        server = await self.rt.redis.info("server")
        role = (await self.rt.redis.info("replication")).get("role", "")
        run_id = str(server.get("run_id", ""))
        if role != "master":
            log.warning("Redis answers as %s, not master: waiting for the new one", role)
            return False
        previous, self.seen = self.seen, run_id
        if not previous or previous == run_id:
            return False
        self.changes += 1
        log.warning("Redis master changed (run_id %s -> %s): reconciling", previous, run_id)
        await self.reconcile()
        return True

    async def reconcile(self) -> int:
        """The pass: how many in-flight tasks had a create intent and no record of it."""
        store = self.rt.store
        unrecorded = 0
        for task_id in await store.reads.in_flight():
            task = await store.reads.get(task_id)
            if task is None or task.state is not TaskState.DISPATCHING or task.remote_id:
                continue
            if task.create_id:
                unrecorded += 1
                log.warning(
                    "task %s: create %s of attempt %d to %s has no recorded answer after the "
                    "master change: waits for its webhook or its deadline, not sent again",
                    task_id,
                    task.create_id,
                    task.attempt,
                    task.target,
                    extra=ctx(task=task_id),
                )
        for listener in self.listeners:
            await listener()
        return unrecorded
