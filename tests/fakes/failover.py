"""A steady load client for failover runs: it submits tasks at a fixed rate over one socket
per serve process, submits again (same taskId) whatever was not acknowledged, and counts
what came back, so a run can report what a failover cost: tasks acknowledged then lost,
results delivered twice (two different outbox entries for one task; the same entry sent
again after a reconnect is the wire's at-least-once, counted as ``redelivered``), and how
long dispatch stopped. :func:`failover_run` is the whole
run (the e2e test asserts on it, bench/failover_bench.py prints it)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from aigcq.emulators._records import paid_runs
from tests.fakes.client import Client, bridge_task
from tests.fakes.processes import Cluster
from tests.fakes.sentinel import SentinelGroup
from tests.fakes.waiting import wait_until

#: how long one submit waits for its reply before it is sent again
REPLY_S = 5.0


@dataclass
class Load:
    """``await load.run(seconds, rate)`` over ``ports`` (one client socket each)."""

    ports: list[int]
    prefix: str = "fo"
    clients: list[Client] = field(default_factory=list)
    acked: dict[str, float] = field(default_factory=dict)  # task id -> when acknowledged
    #: task id -> the outbox entry ids its results came as
    results: dict[str, set[str]] = field(default_factory=dict)
    redelivered: int = 0  # results whose entry had come before
    result_at: dict[str, float] = field(default_factory=dict)  # first result's time
    refused: int = 0  # submits answered with an error (then sent again)
    _replies: dict[str, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    _readers: list[asyncio.Task[None]] = field(default_factory=list)

    async def connect(self) -> Load:
        for i, port in enumerate(self.ports):
            client = await Client(port, f"{self.prefix}-{i}").connect()
            self.clients.append(client)
            self._readers.append(asyncio.create_task(self._read(client)))
        return self

    async def _read(self, client: Client) -> None:
        async for raw in client.ws:
            msg = orjson.loads(raw)
            task_id = msg.get("taskId", "")
            kind = msg.get("type")
            if kind == "result":
                entries = self.results.setdefault(task_id, set())
                self.redelivered += msg.get("id") in entries
                entries.add(msg.get("id", ""))
                self.result_at.setdefault(task_id, time.monotonic())
            elif kind in ("submitted", "error"):
                fut = self._replies.get(task_id)
                if fut is not None and not fut.done():
                    fut.set_result(msg)

    async def submit(self, client: Client, task_id: str) -> None:
        """Until acknowledged: a refusal or no reply sends it again, same id."""
        while True:
            fut = self._replies[task_id] = asyncio.get_running_loop().create_future()
            await client.send(bridge_task(task_id))
            try:
                reply = await asyncio.wait_for(fut, REPLY_S)
            except TimeoutError:
                continue
            if reply["type"] == "submitted":
                self.acked[task_id] = time.monotonic()
                return
            self.refused += 1
            await asyncio.sleep(0.2)  # time: a client's pause before it submits again

    async def run(self, seconds: float, rate: float) -> None:
        """Submit ``rate`` tasks a second for ``seconds``, round robin over the sockets."""
        pending = []
        start = time.monotonic()
        for i in range(int(seconds * rate)):
            client = self.clients[i % len(self.clients)]
            pending.append(asyncio.create_task(self.submit(client, f"{self.prefix}-t{i}")))
            await asyncio.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))  # time: pace
        await asyncio.gather(*pending)

    def report(self, failed_at: float, paid: Counter[str]) -> dict[str, Any]:
        """The run's figures; ``failed_at``: when the master was killed; ``paid``: paid
        creates per task id (the recording RunningHub's)."""
        after = [t for t, at in self.result_at.items() if self.acked.get(t, 0) > failed_at]
        resumed = min((self.result_at[t] for t in after), default=None)
        return {
            "acknowledged": len(self.acked),
            "acknowledged_then_lost": sorted(t for t in self.acked if not self.results.get(t)),
            "duplicates_delivered": {
                t: len(ids) for t, ids in self.results.items() if len(ids) > 1
            },
            "redelivered": self.redelivered,
            "double_paid": {t: n for t, n in paid.items() if n > 1},
            "paid": sum(paid.values()),
            "refused_then_resubmitted": self.refused,
            "dispatch_resumed_after_s": None if resumed is None else round(resumed - failed_at, 2),
        }

    async def close(self) -> None:
        for reader in self._readers:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
        for client in self.clients:
            await client.close()


def _passes(tmp: Path) -> int:
    """Serve logs under ``tmp`` that say a master change was reconciled."""
    logs = tmp.glob("serve-*.log")
    return sum("Redis master changed" in log.read_text(errors="replace") for log in logs)


async def failover_run(
    tmp: Path, *, min_replicas: int, rate: float = 10.0, seconds: float = 8.0
) -> dict[str, Any]:
    """A master, two replicas (one is left after the promotion to confirm writes) and three
    sentinels; two ``aigcq serve`` with ``AIGCQ_REDIS_MIN_REPLICAS=min_replicas``, a
    bridge before an emulated ComfyUI on one of them, a recording RunningHub (cap 3) for
    the overflow; :class:`Load` at ``rate`` for ``seconds``; SIGKILL of the master once a
    quarter of the tasks are acknowledged. The :meth:`Load.report` once every
    acknowledged task has its result (or 40 s passed)."""
    with SentinelGroup(tmp / "redis", replicas=2) as group:
        cluster = Cluster(tmp, group.url)
        load = Load([])
        try:
            rh = cluster.emulator("runninghub", "--max-concurrent", "3", "--duration", "0.5")
            comfy = cluster.emulator("comfyui", "--step-time", "0.05", "--steps", "2")
            cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 3}}})
            env = {
                "AIGCQ_RUNNINGHUB_URL": rh,
                "AIGCQ_REDIS_MIN_REPLICAS": str(min_replicas),
                "AIGCQ_HEALTH_INTERVAL_S": "0.2",
            }
            ports = [cluster.server(**env)[1], cluster.server(**env)[1]]
            cluster.bridge(ports[0], [comfy], "--heartbeat=0.5", AIGCQ_BRIDGE_WS_SILENCE="1")
            load.ports[:] = ports
            await load.connect()
            running = asyncio.create_task(load.run(seconds, rate))
            quarter = int(rate * seconds / 4)
            await wait_until(lambda: len(load.acked) >= quarter, 30, what="a quarter acked")
            failed_at = time.monotonic()
            old = group.kill_master()
            promoted = await asyncio.to_thread(group.wait_promoted, old)
            promoted_after = time.monotonic() - failed_at
            await running  # every task of the run acknowledged (resubmitted until it was)
            with contextlib.suppress(AssertionError):  # a lost task never gets one
                await wait_until(
                    lambda: all(load.results.get(t) for t in load.acked), 40, 0.1, what="results"
                )
            await asyncio.sleep(1.0)  # time: a duplicate would arrive within this
            async with httpx.AsyncClient() as http:
                records = (await http.get(f"{rh}/_emulator/records")).json()
            report = load.report(failed_at, paid_runs(records))
            report["min_replicas"] = min_replicas
            report["promoted_after_s"] = round(promoted_after, 2)
            report["new_master_port"] = promoted.port
            # each serve process noticed the new master and ran its reconcile pass
            await wait_until(lambda: _passes(tmp) >= len(ports), 10, what="reconcile passes")
            report["reconcile_passes"] = _passes(tmp)
            return report
        finally:
            await load.close()
            cluster.close()
