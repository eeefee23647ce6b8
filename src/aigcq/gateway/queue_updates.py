"""Telling submitters where their waiting tasks stand: the estimate in a submit reply, and
``QUEUE_UPDATE`` messages when it changes materially.

Every ``AIGCQ_ETA_INTERVAL_S`` each process refreshes its estimates
(:class:`aigcq.scheduler.estimator.Estimator`) and, for each waiting task in view whose
client is connected here (and did not connect with ``queue=0``), compares the estimate with
the last one that client was told (in the submit reply, or by an update): when it moved
materially (:func:`aigcq.scheduler.estimates.material`) and the last word about the task
is ``AIGCQ_QUEUE_UPDATE_INTERVAL_S`` old, it sends
``{"type":"QUEUE_UPDATE","taskId","position","etaStartMs"}``. At most
:data:`MAX_UPDATES` messages a round; none about a task that left the queue (its next news
is its ``progress`` or its result). The loop runs beside the hot path: the submit reply
only reads the last snapshot (no I/O).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aigcq.gateway.clients import ClientHub
from aigcq.plumbing.background import every
from aigcq.runtime import Runtime
from aigcq.scheduler.estimates import Estimate, material
from aigcq.scheduler.estimator import Estimator
from aigcq.scheduler.policy import Queue
from aigcq.scheduler.targets import InternalTarget

log = logging.getLogger(__name__)

#: the type of the message
QUEUE_UPDATE = "QUEUE_UPDATE"
#: most QUEUE_UPDATE messages one round sends
MAX_UPDATES = 1000


class QueueUpdates:
    def __init__(self, rt: Runtime, clients: ClientHub, internal: InternalTarget | None) -> None:
        self.rt, self.clients = rt, clients
        self.estimator = Estimator(rt, internal)
        #: task -> the estimate its client was last told, and when
        self.told: dict[str, tuple[Estimate, float]] = {}

    def submitted(self, task_id: str, queue: Queue) -> dict[str, Any]:
        """``position`` and ``etaStartMs`` of a task just queued, for its submit reply."""
        estimate = self.estimator.of_submitted(task_id, queue)
        now = time.time()
        self.told[task_id] = (estimate, now)
        return estimate.wire(now)

    async def waiting(self, task_id: str, queue: Queue) -> dict[str, Any]:
        """``position`` and ``etaStartMs`` of a waiting task (the HTTP task view)."""
        return (await self.estimator.of_waiting(task_id, queue)).wire(time.time())

    async def run(self) -> None:
        await every(self.rt.settings.eta_interval_s, self.round, log, "queue estimates")

    async def round(self) -> int:
        """Refresh the estimates and send the updates due; how many were sent."""
        snap = await self.estimator.refresh()
        now, gap = time.time(), self.rt.settings.queue_update_interval_s
        told = {t: said for t, said in self.told.items() if said[1] >= snap.at}  # after the read
        sent = 0
        for task_id, estimate in snap.tasks.items():
            said = self.told.get(task_id)
            if said is not None:
                told[task_id] = said
            conn = self.clients.conns.get(self.estimator.client_of(task_id))
            if conn is None or not conn.queue_updates or sent >= MAX_UPDATES:
                continue
            if said is None or (now - said[1] >= gap and material(said[0], estimate, now)):
                message = {"type": QUEUE_UPDATE, "taskId": task_id, **estimate.wire(now)}
                self.clients.send_news(conn, message)
                told[task_id] = (estimate, now)
                sent += 1
        self.told = told
        return sent
