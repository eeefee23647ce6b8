"""A bridge's TASK_PROGRESS, relayed to the task's client: live only, at most 2/s per task."""

from __future__ import annotations

import time

from aigcq.plumbing.events import publish_progress
from aigcq.plumbing.text import text
from aigcq.runtime import Runtime
from aigcq.wire.bridge import TaskProgressData


class ProgressRelay:
    def __init__(self, rt: Runtime, min_interval_s: float = 0.5) -> None:
        self.rt = rt
        self.min_interval_s = min_interval_s
        self.last: dict[str, float] = {}  # taskId -> when its progress was last relayed

    async def forward(self, data: TaskProgressData) -> None:
        if not self._allow(data.task_id):
            return
        owner = await self.rt.redis.hget(self.rt.store.keys.task(data.task_id), "backendId")
        backend_id = text(owner)
        message: dict[str, object] = {
            "type": "progress",
            "taskId": data.task_id,
            "value": data.value,
            "max": data.max,
            "node": data.node,
        }
        if data.node_name is not None:  # a superset field: only bridges that know it
            message["nodeName"] = data.node_name
        await publish_progress(self.rt.redis, self.rt.store.keys.events, backend_id, message)

    def _allow(self, task_id: str) -> bool:
        now = time.monotonic()
        if now - self.last.get(task_id, float("-inf")) < self.min_interval_s:
            return False
        if len(self.last) >= 1024:  # entries past the interval no longer matter
            self.last = {k: t for k, t in self.last.items() if now - t < self.min_interval_s}
        self.last[task_id] = now
        return True
