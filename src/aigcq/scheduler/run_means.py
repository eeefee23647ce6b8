"""Each workflow's recent run time on our GPUs, kept in Redis for the estimates.

``{prefix}:runmeans`` (HASH workflowId -> ``"<mean s> <runs>"``,
:attr:`aigcq.queue.keys.Keys.run_means`) holds :func:`aigcq.scheduler.policy.next_mean` of
the runs of each workflow that ended successfully on the internal target: from the
task's last ``running`` moment on its timeline to its end. One read and one write per
run, not atomic: two processes ending runs of one workflow at the same instant may keep
one sample of the two, which an estimate can afford. Only :func:`record_run` writes it and
only :func:`read_means` (or :func:`parse_means`) reads it, so a scheduler keeping its own
figures replaces these two.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from redis.asyncio import Redis

from aigcq.plumbing.text import text
from aigcq.queue.keys import Keys
from aigcq.scheduler.ends import TaskEnd
from aigcq.scheduler.policy import next_mean

log = logging.getLogger(__name__)

#: timeline entries read back for a task's last ``running`` moment
_TAIL = 8


def _parse(raw: object) -> tuple[float, int]:
    try:
        mean, count = text(raw).split()
        return float(mean), int(count)
    except (TypeError, ValueError):
        return 0.0, 0


async def record_run(redis: Redis, keys: Keys, workflow_id: str, run_s: float) -> None:
    """One more run of ``workflow_id`` on our GPUs, of ``run_s`` seconds."""
    mean, count = next_mean(*_parse(await redis.hget(keys.run_means, workflow_id)), run_s)
    await redis.hset(keys.run_means, workflow_id, f"{mean:.3f} {count}")


async def read_means(redis: Redis, keys: Keys) -> dict[str, float]:
    """Every workflow's recent mean run time (seconds) on our GPUs."""
    return parse_means(await redis.hgetall(keys.run_means))


def parse_means(raw: Mapping[Any, Any] | Sequence[Any]) -> dict[str, float]:
    """The means of ``{prefix}:runmeans`` as an HGETALL gave it (a dict, or RESP's flat
    list); a field with no run yet is left out."""
    pairs = raw.items() if isinstance(raw, Mapping) else zip(raw[::2], raw[1::2], strict=True)
    means = {text(w): _parse(v) for w, v in pairs}
    return {w: mean for w, (mean, count) in means.items() if count > 0}


class RunTimes:
    """Hears every task's end (:meth:`ended`, a :data:`~aigcq.scheduler.ends.EndListener`)
    and records the run of each success on ``target`` (the internal target's name)."""

    def __init__(self, redis: Redis, keys: Keys, target: str) -> None:
        self.redis, self.keys, self.target = redis, keys, target
        self._pending: set[asyncio.Task[None]] = set()

    def ended(self, task_id: str, target: str, end: TaskEnd, attempt: int | None) -> None:
        if target != self.target or end is not TaskEnd.SUCCEEDED:
            return
        task = asyncio.ensure_future(self._record(task_id, time.time()))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _record(self, task_id: str, ended_at: float) -> None:
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hget(self.keys.task(task_id), "workflowId")
            pipe.lrange(self.keys.timeline(task_id), -_TAIL, -1)
            workflow, entries = await pipe.execute()
            started = [e["t"] for e in map(orjson.loads, entries) if e.get("state") == "running"]
            if started:
                await record_run(
                    self.redis, self.keys, text(workflow or ""), ended_at - started[-1]
                )
        except Exception as exc:  # an estimate's input: a lost sample is no harm
            log.info("task %s: run time not recorded: %r", task_id, exc)
