"""Chaos run (issue 15): steady load on two ``aigcq serve`` processes sharing one Redis
(AOF), each with a bridge (``aigcq bridge``) in front of emulated ComfyUI instances, and
overflowing to a recording RunningHub emulator, while random faults strike: SIGKILL of
either serve, of either bridge (each restarted a moment later), a routine restart of a
bridge (SIGTERM, started again at once), of Redis (restarted), lost create replies, faulty
status answers, slow cancels and late webhooks (past the task's deadline) from the
platform, client cancels
of running tasks, tasks by a workflowId nobody registered (a bridge refuses them, 380:
they fail ``WorkflowNotFound`` at once and must idle no GPU). One instance lacks a node
class (``ImageInvert``): every fifth task needs it, the others run anywhere. Prints JSON:

    submitted, lost, duplicated_to_client, double_paid, paid_but_failed, peak_over_cap,
    leaked_slots

all of which must be 0, plus what happened (faults, outcomes, targets, seconds).
``charged_not_billed`` is how far the runs aigcq charged (its spend's task counts) are
from the runs RunningHub ended and so billed (``billed_runs``: successes, failures and
cancels, late webhooks included): 0 too (:data:`MUST_BE_ZERO`; a run's charge is made due
with its end, so a serve killed between the two leaves it to a sweep, not lost).
``paid_but_failed`` counts tasks RunningHub created (and so bills) whose client was told
they failed, and never told otherwise.
``paid_uncertain`` counts those of them that ended ``UncertainSubmit``: the window a
single serve leaves (a create accepted just before its SIGKILL, whose reply and webhook
retries all fell inside its restart), closed by this run's two serves behind one callback
address (:mod:`bench.front`; docs/operations.md, "Paid platforms under faults").
``paid_late_success`` counts tasks whose client was told they failed ``UncertainSubmit``
and then got their paid result as a late success (a second entry, ``"late": true``):
paid, the late success delivered; neither a duplicate nor a failure.
``duplicated_to_client`` counts tasks whose client got two different results (two outbox
entries, a late success after a failure aside); the same entry sent again after a crash
or a reconnect (the wire's promise is at least once, each result with a stable ``id``,
which the SDK drops when it comes again) is ``redelivered``, reported, not a failure.
``leaked_slots`` counts, once the load stopped and everything settled: tasks still in a
paid account's cap or in flight in Redis (running sets, orphans, ``inflight``), tasks
RunningHub still runs, and bridge slots not free as the hub or the bridge itself sees
them (``bridge_slots_taken`` per bridge).
``paid_while_free`` and ``gpu_idle_s`` (see :mod:`bench.gpu_idle`) say whether our GPUs
stayed busy before anything was paid; they are timing figures, reported, not asserted.
``--shares off`` runs the serves with strict first come, first served, ``--users N`` sends
the tasks from N end users in turn, and ``--user-limit K`` bounds each user's tasks on our
GPUs (``AIGCQ_USER_MAX_RUNNING``): its counts must be back to none at the end
(``leaked_slots``).

    python bench/chaos.py [--seconds 20] [--minutes N] [--rate 10] [--seed 1]
                          [--faults kill_serve,kill_bridge,...]
                          [--shares on|off] [--users N] [--user-limit K]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import orjson
import redis.asyncio as aioredis
import websockets
from redis.exceptions import RedisError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from bench.fleet import Fleet
from bench.front import Front
from bench.gpu_idle import Timeline, free_at_creates, gpu_idle_s, longest_idle, paid_while_free
from bench.processes import CLIENT_TOKEN, Cluster, Proc

from aigcq.cli.demo import GRAPH
from aigcq.embedded.redis import EmbeddedRedis
from aigcq.emulators._records import paid_runs

CAP = 6  # the account's concurrency, also RunningHub's own cap for the key
KEY = "chaos-key"
SERVE_ENV = {
    "AIGCQ_TASK_DEADLINE_S": "6",
    "AIGCQ_HTTP_TIMEOUT_S": "2",
    "AIGCQ_FULL_BACKOFF_S": "0.3",
    "AIGCQ_SWEEP_INTERVAL_S": "0.3",
}


#: seconds after a killed serve, bridge or Redis is back until its bridges take work again
#: (the bridge's reconnect back-off while aigcq was away is at most 2 s)
#: after a restart, once the bridges are registered: capacity known everywhere
SETTLE_S = 0.3
#: what paid_while_free counts: an instance idle longer than this at a create
FREE_FOR_S = 0.2
#: the wait list of the chaos tasks
WAIT_KEY = "aigcq:proj:comfyui:wait"

#: the faults :class:`Chaos` picks from
FAULTS = (
    "kill_serve",
    "kill_bridge",
    "restart_bridge",
    "kill_redis",
    "lose",
    "status",
    "cancel",
    "unknown",
    "late_webhook",
)


#: the graph of the tasks any instance can run (no ``ImageInvert``)
BASIC_GRAPH = {
    "1": {
        "class_type": "EmptyImage",
        "inputs": {"width": 64, "height": 48, "batch_size": 1, "color": 0},
    },
    "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "c"}},
}
#: what the instance that lacks ``ImageInvert`` has
BASIC_NODES = ("EmptyImage", "SaveImage")


def special(task_id: str) -> bool:
    """Every fifth task needs ``ImageInvert``, which one instance lacks."""
    return int(task_id.rpartition("-")[2]) % 5 == 0


def task(task_id: str, unknown: bool = False, users: int = 0) -> dict[str, Any]:
    """A task RunningHub and a bridge can run (a special one: not every instance), or
    (``unknown``) one by a workflowId nobody registered: a bridge refuses it (380); with
    ``users``, by one of that many end users (``userId``), in turn."""
    payload: dict[str, Any] = {"workflowId": "chaos-basic", "workflow": BASIC_GRAPH}
    if unknown:
        payload = {"workflowId": "chaos-unknown"}
    elif special(task_id):
        payload = {"workflowId": "chaos-special", "workflow": GRAPH}
    message = {
        "type": "generate",
        "taskId": task_id,
        "platform": "comfyui",
        "AIGC": "proj",
        "payload": payload,
    }
    if users:
        message["userId"] = f"u{int(task_id.rpartition('-')[2]) % users}"
    return message


class Load:
    """One business backend submitting at a steady rate over whichever serve is up,
    resending what was not acknowledged, acknowledging every result (``ack=1``)."""

    def __init__(self, ports: list[int], rate: float, users: int = 0) -> None:
        self.ports, self.rate, self.users = ports, rate, users
        self.results: dict[str, list[str]] = {}  # taskId -> statuses received
        self.entries: dict[str, set[str]] = {}  # taskId -> the outbox ids they came as
        self.failures: dict[str, str] = {}  # taskId -> why it failed
        self.late: set[str] = set()  # a late success came after the failure
        self.unacked: set[str] = set()  # submitted by us, no ``submitted`` reply yet
        self.submitted: list[str] = []
        #: tasks by a workflow no bridge has; how many of the next ones are to be such
        self.unknown: set[str] = set()
        self.unknown_next = 0
        self.ws: Any = None
        self._turn = 0

    async def _connect(self) -> None:
        while True:
            port = self.ports[self._turn % len(self.ports)]
            self._turn += 1
            query = urlencode({"token": CLIENT_TOKEN, "id": "chaos", "ack": "1"})
            try:
                self.ws = await websockets.connect(f"ws://127.0.0.1:{port}/?{query}")
                await self.resend_unacked()
                return
            except (OSError, websockets.WebSocketException, TimeoutError):
                await asyncio.sleep(0.2)

    async def _send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(websockets.WebSocketException, AttributeError):
            await self.ws.send(orjson.dumps(message).decode())

    async def read(self) -> None:
        """Read forever, reconnecting whenever the socket goes."""
        while True:
            if self.ws is None:
                await self._connect()
            try:
                msg = orjson.loads(await self.ws.recv())
            except (websockets.WebSocketException, OSError):
                self.ws = None
                continue
            await self._on(msg)

    async def _on(self, msg: dict[str, Any]) -> None:
        task_id = msg.get("taskId", "")
        if msg["type"] == "submitted":
            self.unacked.discard(task_id)
        elif msg["type"] == "result":
            self.results.setdefault(task_id, []).append(msg["status"])
            if msg["status"] == "failed":
                self.failures[task_id] = f"{msg.get('code')}: {msg.get('error')}"
            self.entries.setdefault(task_id, set()).add(msg["id"])
            if msg.get("late") is True and msg["status"] == "success":
                self.late.add(task_id)
            await self._send({"type": "ack", "id": msg["id"]})
        elif msg["type"] == "error" and task_id in self.unacked:
            await asyncio.sleep(0.2)  # e.g. Redis down: try again
            await self._send(self.message(task_id))

    async def submit(self, seconds: float) -> None:
        start, i = time.monotonic(), 0
        while time.monotonic() - start < seconds:
            task_id = f"chaos-{i}"
            if self.unknown_next > 0:
                self.unknown_next -= 1
                self.unknown.add(task_id)
            self.submitted.append(task_id)
            self.unacked.add(task_id)
            await self._send(self.message(task_id))
            i += 1
            await asyncio.sleep(1 / self.rate)

    async def cancel(self, task_id: str) -> None:
        await self._send({"type": "cancel", "taskId": task_id})

    def message(self, task_id: str) -> dict[str, Any]:
        return task(task_id, task_id in self.unknown, self.users)

    async def resend_unacked(self) -> None:
        for task_id in sorted(self.unacked):
            await self._send(self.message(task_id))


class Chaos:
    """Picks and applies faults; restarts what it killed."""

    def __init__(
        self,
        cluster: Cluster,
        redis: EmbeddedRedis,
        rh: str,
        load: Load,
        seed: int,
        faults: tuple[str, ...] = FAULTS,
        serve_env: dict[str, str] | None = None,
    ) -> None:
        self.cluster, self.redis, self.rh, self.load = cluster, redis, rh, load
        #: settings every serve starts with, beside :data:`SERVE_ENV`
        self.serve_env = {**SERVE_ENV, **(serve_env or {})}
        self.fleet = Fleet(cluster)
        self.rng = random.Random(seed)
        self.faults = faults
        self.serves: dict[int, Proc] = {}
        #: where RunningHub's webhooks go: a front for every serve (:mod:`bench.front`)
        self.callback_url = ""
        self.done: Counter[str] = Counter()
        #: when which instances could not be used: (from, to, instances)
        self.unusable: list[tuple[float, float, list[str]]] = []
        #: per kill: seconds from the restart to every bridge registered again
        self.back_s: dict[str, list[float]] = defaultdict(list)
        #: (when, fault) for each fault struck
        self.struck: list[tuple[float, str]] = []

    def start_serve(self, port: int | None = None) -> int:
        env = {"AIGCQ_RUNNINGHUB_URL": self.rh, "AIGCQ_CALLBACK_URL": self.callback_url}
        proc, port = self.cluster.server(port, **env, **self.serve_env)
        self.serves[port] = proc
        return port

    async def kill_serve(self, port: int, down_s: float) -> None:
        """SIGKILL the serve on ``port``; start it again on that port ``down_s`` later."""
        self.serves[port].kill()
        await asyncio.sleep(down_s)
        await asyncio.to_thread(self.start_serve, port)

    async def strike(self) -> None:
        action = self.rng.choice(self.faults)
        self.done[action] += 1
        struck = time.time()
        self.struck.append((struck, action))
        if action in ("kill_bridge", "restart_bridge"):
            strike = self.fleet.kill_one if action == "kill_bridge" else self.fleet.restart_one
            bridge = await strike(self.rng)
            await self._back(action, bridge.server_port, struck, bridge.comfyui)
        elif action == "kill_serve":
            port = self.rng.choice(sorted(self.serves))
            await self.kill_serve(port, self.rng.uniform(0.5, 3.0))
            await self._back(action, port, struck, self.fleet.instances(port))
        elif action == "kill_redis":
            self.redis.kill()
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))
            self.redis.start()
            await self._back(action, None, struck, self.fleet.instances())
        elif action == "lose":
            await self._faults(drop_create_replies=self.rng.randint(1, 3))
        elif action == "cancel":  # a client cancel; RunningHub takes a while to stop it
            await self._faults(cancel_delay_s=self.rng.uniform(0, 2))
            live = [t for t in self.load.submitted[-40:] if t not in self.load.results]
            for task_id in self.rng.sample(live, min(2, len(live))):
                await self.load.cancel(task_id)
        elif action == "unknown":  # tasks a bridge refuses (380)
            self.load.unknown_next += self.rng.randint(1, 3)
        elif action == "late_webhook":  # past the task's deadline (AIGCQ_TASK_DEADLINE_S)
            late = {"late_webhooks": self.rng.randint(1, 3)}
            await self._faults(**late, late_webhook_s=self.rng.uniform(4.0, 10.0))
        else:
            kinds = ["5xx", "non_json", "unknown_code"]
            await self._faults(status_faults=self.rng.choices(kinds, k=5))

    async def _back(
        self, action: str, server_port: int | None, since: float, instances: list[str]
    ) -> None:
        """``instances`` could not be used from ``since`` (a kill) until what was killed is
        back (just restarted) and their bridges are registered again (each serve's view),
        and :data:`SETTLE_S` more; how long that took after the restart is ``back_s``."""
        restarted = time.time()
        await self.fleet.registered(server_port)
        self.back_s[action].append(round(time.time() - restarted, 2))
        self.unusable.append((since, time.time() + SETTLE_S, instances))

    def capable(self, task_id: str) -> frozenset[str]:
        """The instances that can run ``task_id``."""
        if task_id in self.load.unknown:
            return frozenset()
        every = frozenset(self.fleet.instances())
        return every - self.fleet.basic if special(task_id) else every

    def timeline(self, start: float, waiting: list[tuple[float, list[str]]]) -> Timeline:
        """What :mod:`bench.gpu_idle` needs, but the busy spans (read at the end)."""
        instances = self.fleet.instances()
        out: dict[str, list[tuple[float, float]]] = {u: [] for u in instances}
        for since, until, struck in self.unusable:
            for url in struck:
                out[url].append((since, until))
        runnable = {
            url: [(at, sum(url in self.capable(t) for t in ids)) for at, ids in waiting]
            for url in instances
        }
        return Timeline(start=start, end=time.time(), out=out, waiting=runnable)

    async def _faults(self, **faults: Any) -> None:
        async with httpx.AsyncClient() as http:
            await http.post(f"{self.rh}/_emulator/faults", json=faults)

    async def run(self, seconds: float) -> None:
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            await asyncio.sleep(self.rng.uniform(1.0, 4.0))
            await self.strike()


async def leaked_slots(redis_url: str) -> int:
    """Tasks still counted against a cap (in flight or orphaned) once all have ended:
    running sets (paid accounts' and the bridges'), orphans, the in-flight index, the
    per-user running counts (``AIGCQ_USER_MAX_RUNNING``)."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        keys = [k async for k in client.scan_iter("aigcq:running:*")]
        keys += [k async for k in client.scan_iter("aigcq:orphans:*")]
        keys += [k async for k in client.scan_iter("aigcq:userrun:*")]
        keys.append("aigcq:inflight")
        return sum([await client.zcard(k) for k in keys])
    finally:
        await client.aclose()


async def charges_due(redis_url: str) -> int:
    """Tasks with a billed run's charge still due (made by the process that ended it, else
    by a sweep once it is overdue): 0 once every charge is made."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        return int(await client.zcard("aigcq:dues"))
    finally:
        await client.aclose()


async def held_records(redis_url: str) -> int:
    """Tasks Redis still records as held by a bridge (``bridge:{id}:tasks`` entries and
    ``bridgesof:{taskId}`` keys) once all have ended. Not a slot, so not in ``leaked_slots``:
    a TASK_END refused as gone (its attempt superseded after the bridge's deadline) is not
    counted against the bridge, and leaves its ``bridgesof`` key to its TTL."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        held = [await client.hlen(k) async for k in client.scan_iter("aigcq:bridge:*:tasks")]
        owners = [k async for k in client.scan_iter("aigcq:bridgesof:*")]
        return sum(held) + len(owners)
    finally:
        await client.aclose()


async def sample_waiting(redis_url: str, samples: list[tuple[float, list[str]]]) -> None:
    """Every 50 ms, the tasks waiting to be dispatched (nothing while Redis is down)."""
    client = aioredis.Redis.from_url(redis_url, socket_timeout=0.5, decode_responses=True)
    try:
        while True:
            with contextlib.suppress(RedisError, OSError):
                samples.append((time.time(), await client.zrange(WAIT_KEY, 0, -1)))
            await asyncio.sleep(0.05)
    finally:
        await client.aclose()


def paid_failed(runs: Counter[str], load: Load) -> list[str]:
    """Tasks RunningHub created (and bills) whose client was told they failed (and no late
    success followed)."""
    results = load.results
    return sorted(t for t in runs if "failed" in results.get(t, ()) and t not in load.late)


def duplicated(load: Load) -> int:
    """Tasks whose client got two different results, a late success after its failure
    not counted as one."""
    return sum(1 for t, ids in load.entries.items() if len(ids) - (t in load.late) > 1)


async def gpu_figures(
    chaos: Chaos, start: float, waiting: list[tuple[float, list[str]]], recs: dict[str, Any]
) -> dict[str, Any]:
    """The two figures of :mod:`bench.gpu_idle` for the run."""
    timeline = chaos.timeline(start, waiting)
    timeline.busy = await chaos.fleet.busy_spans()
    creates = [(c["at"], chaos.capable(c["task"])) for r in recs.values() for c in r["creates"]]
    free = sorted(f for f in free_at_creates(timeline, creates) if f > 0)
    return {
        "paid_while_free": paid_while_free(timeline, creates, FREE_FOR_S),
        "gpu_idle_s": gpu_idle_s(timeline),
        "free_at_paid_creates_ms": [round(f * 1000) for f in free],
        "paid_while_free_detail": paid_while_free_detail(chaos, start, recs, timeline),
    }


def paid_while_free_detail(
    chaos: Chaos, start: float, recs: dict[str, Any], timeline: Timeline
) -> list[dict[str, Any]]:
    """Each create ``paid_while_free`` counts: its task, when (s from the start), the idle
    instance (the index in ``--instances`` order), for how long, and the fault struck
    last before it (with how long before)."""
    creates = [(c["task"], c["at"]) for r in recs.values() for c in r["creates"]]
    instances = chaos.fleet.instances()
    found = longest_idle(timeline, [(at, chaos.capable(task)) for task, at in creates])
    detail = []
    for (task, at), free in zip(creates, found, strict=True):
        if free is None or free[1] <= FREE_FOR_S:
            continue
        before = [(t, action) for t, action in chaos.struck if t <= at]
        last = {"fault": before[-1][1], "s_before": round(at - before[-1][0], 2)} if before else {}
        detail.append(
            {
                "task": task,
                "at_s": round(at - start, 2),
                "instance": instances.index(free[0]),
                "idle_ms": round(free[1] * 1000),
                **last,
            }
        )
    return detail


async def records(rh: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        found: dict[str, Any] = (await http.get(f"{rh}/_emulator/records")).json()
        return found


async def rh_stats(rh: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        found: dict[str, Any] = (await http.get(f"{rh}/_emulator/stats")).json()
        return found


def billed(stats: dict[str, Any]) -> int:
    """The runs RunningHub ended (each one billed: a success, a failure, a cancel)."""
    return int(stats["succeeded"]) + int(stats["failed"])


async def charged(redis_url: str) -> int:
    """The paid runs aigcq charged (the spend's per-account task counts, every month)."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        total = 0
        async for key in client.scan_iter(match="aigcq:spend:month:*"):
            for field_, value in (await client.hgetall(key)).items():
                row = orjson.loads(field_)
                if row[0] == "a" and row[-1] == "tasks":
                    total += int(float(value))
        return total
    finally:
        await client.aclose()


async def settle(load: Load, fleet: Fleet, rh: str, redis_url: str, within: float) -> None:
    """Wait until every task has a result, nothing runs or is counted any more, every
    webhook RunningHub owes (a late one too) was sent, and every charge is made."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        await load.resend_unacked()
        stats = await rh_stats(rh)
        sent = stats["webhooks_delivered"] + stats["webhooks_failed"]
        running = sum(r["current"] for r in (await records(rh)).values()) + billed(stats) - sent
        done = all(t in load.results for t in load.submitted)
        try:
            idle = running == 0 and await leaked_slots(redis_url) == 0
            idle = idle and await charges_due(redis_url) == 0
        except RedisError:  # the last restart may still be loading its AOF: look again
            idle = False
        if done and idle and not any((await fleet.slots_taken()).values()):
            return
        await asyncio.sleep(1.0)


async def targets(redis_url: str, task_ids: list[str]) -> Counter[str]:
    """Where the tasks ended (their last target; "" = never dispatched)."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        pipe = client.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hget(f"aigcq:task:{task_id}", "target")
        return Counter(t or "" for t in await pipe.execute())
    finally:
        await client.aclose()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    seconds = args.minutes * 60 if args.minutes else args.seconds
    tmp = Path(tempfile.mkdtemp(prefix="aigcq-chaos-"))
    redis = EmbeddedRedis(tmp / "redis", persist=True)
    cluster = Cluster(tmp, redis.start())
    started = time.monotonic()
    front = Front()
    try:
        rh = cluster.emulator("runninghub", "--max-concurrent", str(CAP), "--duration", "0.5")
        cluster.write_models({"proj": {"comfyui": {"apikey": KEY, "concurrency": CAP}}})
        ports: list[int] = []
        load = Load(ports, args.rate, args.users)
        policy = {"AIGCQ_SHARES": args.shares}
        if args.user_limit:
            policy["AIGCQ_USER_MAX_RUNNING"] = str(args.user_limit)
        faults = tuple(args.faults.split(","))
        chaos = Chaos(cluster, redis, rh, load, args.seed, faults, policy)
        chaos.callback_url = f"http://127.0.0.1:{await front.start()}"
        ports += [chaos.start_serve(), chaos.start_serve()]
        front.backends = ports
        basic = {(0, 1): BASIC_NODES}  # the first bridge's second instance
        await asyncio.to_thread(chaos.fleet.start, ports, [2, 1], basic)
        await chaos.fleet.registered()
        usable_from = time.time() + SETTLE_S
        waiting: list[tuple[float, list[str]]] = []
        sampler = asyncio.create_task(sample_waiting(cluster.redis_url, waiting))
        reader = asyncio.create_task(load.read())
        await asyncio.gather(load.submit(seconds), chaos.run(seconds))
        await settle(load, chaos.fleet, rh, cluster.redis_url, within=args.drain)
        reader.cancel()
        sampler.cancel()
        recs = await records(rh)
        runs = paid_runs(recs)
        peak = max((r["peak"] for r in recs.values()), default=0)
        outcomes = Counter("success" if t in load.late else s[0] for t, s in load.results.items())
        bridge_slots = await chaos.fleet.slots_taken()
        billing = billed(await rh_stats(rh))
        return {
            "seconds": round(time.monotonic() - started, 1),
            "submitted": len(load.submitted),
            "lost": sum(1 for t in load.submitted if t not in load.results),
            "duplicated_to_client": duplicated(load),
            "redelivered": sum(len(s) - len(load.entries[t]) for t, s in load.results.items()),
            "double_paid": sum(1 for n in runs.values() if n > 1),
            "paid_but_failed": len(paid_but_failed := paid_failed(runs, load)),
            "paid_late_success": sum(1 for t in load.late if t in runs),
            "paid_uncertain": sum(
                "UncertainSubmit" in load.failures.get(t, "") for t in paid_but_failed
            ),
            "paid_but_failed_tasks": {t: load.failures.get(t, "") for t in paid_but_failed},
            "peak_over_cap": max(0, peak - CAP),
            # every run RunningHub ended is charged once (a late one, an orphan's too)
            "charged_not_billed": abs(await charged(cluster.redis_url) - billing),
            "billed_runs": billing,
            "leaked_slots": await leaked_slots(cluster.redis_url)
            + sum(r["current"] for r in recs.values())
            + sum(bridge_slots.values()),
            "bridge_slots_taken": bridge_slots,
            "bridge_tasks_recorded": await held_records(cluster.redis_url),
            "outcomes": dict(outcomes),
            "unknown_workflow": {
                "tasks": len(load.unknown),
                "failed_as_not_found": sum(
                    "WorkflowNotFound" in load.failures.get(t, "") for t in load.unknown
                ),
            },
            "targets": dict(await targets(cluster.redis_url, load.submitted)),
            "faults": dict(chaos.done),
            "back_s": dict(chaos.back_s),
            **await gpu_figures(chaos, usable_from, waiting, recs),
            "creates": sum(runs.values()),
            "cancels": sum(len(r["cancels"]) for r in recs.values()),
        }
    finally:
        await front.close()
        cluster.close()
        redis.stop()


#: the figures that must be 0 (those a report has: the soak's ``duplicated`` is this run's
#: ``duplicated_to_client``)
MUST_BE_ZERO = (
    "lost",
    "duplicated_to_client",
    "duplicated",
    "double_paid",
    "paid_but_failed",
    "charged_not_billed",
    "peak_over_cap",
    "leaked_slots",
)


def failures(report: dict[str, Any]) -> dict[str, int]:
    """The figures that must be 0, where they are not."""
    return {k: report[k] for k in MUST_BE_ZERO if report.get(k)}


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"seconds": 3.0, "rate": 3.0, "drain": 30.0}


def parse(
    argv: list[str] | None = None, *, faults: tuple[str, ...] = FAULTS, doc: str | None = None
) -> argparse.Namespace:
    """The chaos run's options; ``faults`` (default of ``--faults``) and ``doc`` (its
    ``--help``) let another bench run a part of it (``bench/chaos_fleet.py``)."""
    parser = argparse.ArgumentParser(
        description=doc or __doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="load and faults (short)")
    parser.add_argument("--minutes", type=float, default=0.0, help="a soak instead")
    parser.add_argument("--rate", type=float, default=10.0, help="tasks submitted a second")
    parser.add_argument("--drain", type=float, default=90.0, help="most seconds to settle")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shares", choices=("on", "off"), default="on")
    parser.add_argument("--users", type=int, default=0, help="end users the tasks come from")
    parser.add_argument(
        "--user-limit", type=int, default=0, help="AIGCQ_USER_MAX_RUNNING (0: none)"
    )
    parser.add_argument(
        "--faults",
        default=",".join(faults),
        help=f"comma-separated faults to strike with (of {', '.join(FAULTS)})",
    )
    args = smoke.parse_args(parser, SMOKE, argv)
    unknown = set(args.faults.split(",")) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}")
    return args


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse())), indent=2))
