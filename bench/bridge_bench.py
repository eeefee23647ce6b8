"""Bridges end to end: a real ``aigcq serve`` and fake bridges completing instantly. Prints JSON.

Measures (issue 3's targets in brackets):

* ``dispatch``   submit → TASK_ASSIGN latency at a paced rate (p99 < 5 ms at 500/s);
* ``lifecycle``  client → bridge → TASK_END → client throughput, 20 bridges × 8 instances
  completing at once (≥ 2,000 tasks/s);
* ``loss``       bridge socket lost → the first task reaching RunningHub (< 200 ms);
* ``recovery``   a bridge reconnect → its first new TASK_ASSIGN, and a task's instance dying
  (an ``infrastructure`` failure) → the task assigned to another bridge (< 1 s each);
* ``mixed``      mixed capabilities (issue 24 item 3), on real processes: one ``aigcq
  bridge`` in front of two ComfyUI emulators, A with every node class (a prompt there takes
  3 s), B without ``ImageInvert``. Each round a task only A can run is running, a second
  one waits behind it, and 8 basic tasks are submitted every ``--mixed-pace-s``: the
  refusals (TASK_ACKs not 0, from the tasks' timelines; target 0), how often the waiting
  special task was claimed, and each basic task's wait from its submit to its prompt
  starting on B (B is idle for each one: the wait is the hub's). ``--mixed-only`` runs
  just this;
* ``new_bridge`` two serve processes, RunningHub configured, tasks arriving at both: a
  replacement bridge with a new id (a seed bridge restarted) on the process that lost
  its bridge, and a bridge moving to that process from the other: REGISTER → its first
  TASK_ASSIGN, and the paid creates in between (issue 24.6: < 1 s, 0; ``--new-bridge-only``
  runs just this);
* ``routing``    one routing decision in-process at 1,000 bridges × 8 instances:
  ``routing.plan`` + the hub's free-slot count + ``BridgeRegistry.pick`` + taking the slot
  (< 1 ms); the old linear pick alongside for comparison; a task only a tenth of the
  bridges can run, and one none can (it goes to the external platform: the first ask after
  a change to the fleet scans it, later ones are O(1)). ``--routing-only`` runs just this.

The fake bridges speak the bridge protocol with the ``websockets`` client: REGISTER, TASK_ACK
per TASK_ASSIGN, TASK_END POSTed to the ``webhookUrl`` over kept-alive aiohttp connections,
and a HEARTBEAT every ``--heartbeat-s`` (30 s, the seed's interval; the hub frees a slot at
its TASK_END, so it does not wait for one).
The hub closes a bridge that sends more than ``AIGCQ_BRIDGE_MAX_MSGS_PER_S`` (100) frames
a second; at 100 tasks/s per bridge that limit, not the hub, is the ceiling, so by default
the server runs with it lifted (``--flood-limit 100`` keeps it).

    python bench/bridge_bench.py [--rates 500,200] [--tasks 4000] [--flood-limit 0]
    python bench/bridge_bench.py --routing-only
    python bench/bridge_bench.py --mixed-only [--mixed-rounds 3]
    python bench/bridge_bench.py --new-bridge-only [--loss-trials 5]
    python bench/bridge_bench.py --lifecycle-only [--shares off]

``--lifecycle-only`` runs just ``dispatch`` and ``lifecycle`` (the hot path's figures: its
server CPU per task is what a change to the dispatch path is judged by); ``--shares off``
runs the serve with ``AIGCQ_SHARES=false`` (strict first come, first served).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import aiohttp
import httpx
import orjson
import websockets
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from bench.host import cpu_seconds, python_speed_ms
from bench.processes import BRIDGE_TOKEN, CLIENT_TOKEN, Cluster, Proc, wait_http
from tests.fakes.client import Client, generate
from tests.fakes.comfyui import E2E_GRAPH

from aigcq.bridges.lookahead import Candidate, Reach, Rules, choose
from aigcq.bridges.placing import Matching
from aigcq.bridges.registry import BridgeConn, BridgeRegistry
from aigcq.bridges.slots import Assignment, SlotLedger
from aigcq.embedded.redis import EmbeddedRedis
from aigcq.scheduler.routing import plan
from aigcq.wire.bridge import InstanceInfo
from aigcq.wire.capabilities import Needs

SLOTS = 8
END_DATA = orjson.dumps(
    {
        "code": 0,
        "msg": "success",
        "data": [{"fileUrl": "http://b/x.png", "fileType": "png", "taskCostTime": 0}],
    }
).decode()
#: what ``aigcq bridge`` reports when the instance running the task died
LOST_DATA = orjson.dumps(
    {
        "code": 1,
        "msg": "instance died",
        "data": [],
        "failure": {"class": "infrastructure", "code": "InstanceLost", "message": "died"},
    }
).decode()


def now() -> float:
    return time.perf_counter()


class FakeBridge:
    """One bridge with ``slots`` instances that finish every task the moment it arrives."""

    def __init__(
        self,
        url: str,
        bridge_id: str,
        http: aiohttp.ClientSession,
        beat_s: float,
        *,
        failing: bool = False,
        slots: int = SLOTS,
    ) -> None:
        self.url, self.bridge_id, self.http, self.beat_s = url, bridge_id, http, beat_s
        self.failing = failing  # every task ends as a machine's failure
        self.slots = slots
        self.running = 0
        self.assigned: dict[str, float] = {}  # taskId -> perf_counter at TASK_ASSIGN
        self.ended: dict[str, float] = {}  # taskId -> perf_counter at its TASK_END
        self.registered = 0.0  # perf_counter when REGISTER was sent
        self.got_work = asyncio.Event()  # a first TASK_ASSIGN came
        self.ws: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._beats: asyncio.Task[None] | None = None
        self._posts: set[asyncio.Task[None]] = set()

    def _counts(self) -> dict[str, Any]:
        free = self.slots - self.running
        return {"instanceCount": self.slots, "availableInstanceCount": free}

    async def connect(self) -> FakeBridge:
        self.ws = await websockets.connect(f"{self.url}?token={BRIDGE_TOKEN}", max_size=None)
        self.registered = now()
        await self._send("REGISTER", {"bridgeId": self.bridge_id, **self._counts(), "tasks": []})
        self._reader = asyncio.create_task(self._read())
        self._beats = asyncio.create_task(self._heartbeats())
        return self

    async def _send(self, type_: str, data: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps({"type": type_, "data": data}).decode())

    async def _read(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for raw in self.ws:
                msg = orjson.loads(raw)
                if msg["type"] == "TASK_ASSIGN":
                    data = msg["data"]
                    self.assigned[data["taskId"]] = now()
                    self.got_work.set()
                    self.running += 1
                    ack = {"taskId": data["taskId"], "taskStatus": "RUNNING"}
                    await self._send("TASK_ACK", {"code": 0, "msg": "success", "data": ack})
                    post = asyncio.create_task(self._end(data["taskId"], data["webhookUrl"]))
                    self._posts.add(post)
                    post.add_done_callback(self._posts.discard)
                elif msg["type"] == "PING":
                    await self.ws.send('{"type":"PONG"}')
                elif msg["type"] == "ERROR":
                    print(f"{self.bridge_id}: {msg}", file=sys.stderr)

    async def _end(self, task_id: str, hook: str) -> None:
        self.running -= 1  # the instance is free once its task ends, before TASK_END is sent
        data = LOST_DATA if self.failing else END_DATA
        body = {"event": "TASK_END", "taskId": task_id, "eventData": data}
        self.ended[task_id] = now()
        for _ in range(5):
            with contextlib.suppress(aiohttp.ClientError):
                async with self.http.post(hook, json=body) as resp:
                    await resp.read()
                    if resp.status < 500:
                        break
            await asyncio.sleep(0.05)

    async def _heartbeats(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                await asyncio.sleep(self.beat_s)
                await self._send("HEARTBEAT", {**self._counts(), "busyInstanceCount": self.running})

    def abort(self) -> None:
        """Lose the connection the way a killed process does (no closing handshake)."""
        self.ws.transport.abort()

    async def close(self) -> None:
        for task in (self._reader, self._beats):
            if task is not None:
                task.cancel()
        with contextlib.suppress(Exception):
            await self.ws.close()


class Load:
    """Client sockets submitting tasks and timing their results."""

    def __init__(self, port: int, clients: int = 4) -> None:
        self.port, self.n_clients = port, clients
        self.sent: dict[str, float] = {}
        self.done: dict[str, float] = {}
        self.duplicates = 0
        self.pending: set[str] = set()
        self.all_done = asyncio.Event()

    async def run(self, n: int, rate: float | None, prefix: str) -> float:
        conns = [await Client(self.port, f"{prefix}-c{i}").connect() for i in range(self.n_clients)]

        async def reader(c: Client) -> None:
            while True:
                try:
                    msg = orjson.loads(await c.ws.recv())
                except websockets.ConnectionClosed:  # a trial stopping its server
                    return
                if msg["type"] == "result":
                    self.duplicates += msg["taskId"] in self.done
                    self.done[msg["taskId"]] = now()
                    self.pending.discard(msg["taskId"])
                    if not self.pending:
                        self.all_done.set()

        ids = [f"{prefix}-{i}" for i in range(n)]
        self.pending, self.all_done = set(ids), asyncio.Event()
        readers = [asyncio.create_task(reader(c)) for c in conns]
        start = now()
        payload: dict[str, Any] = {"workflowId": "bench", "nodeInfoList": []}
        for i, tid in enumerate(ids):
            self.sent[tid] = now()
            await conns[i % len(conns)].send(generate(tid, **payload))
            if rate:
                await asyncio.sleep(max(0.0, start + (i + 1) / rate - now()))
        deadline = now() + 60
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.all_done.wait(), 60)
        elapsed = max(self.done.get(t, deadline) for t in ids) - start
        for r in readers:
            r.cancel()
        for c in conns:
            await c.close()
        return elapsed


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * q))], 3)


def start_server(cluster: Cluster, flood_limit: int, **env: str) -> tuple[Proc, int]:
    port = cluster.ports.take()
    log = cluster.tmp / f"serve-{port}.log"
    env = {"AIGCQ_BRIDGE_MAX_MSGS_PER_S": str(flood_limit), **env}  # 0 = no limit
    proc = Proc(["serve", "--log-level", "WARNING"], cluster.server_env(port, **env), log)
    cluster.procs.append(proc.start())
    wait_http(f"http://127.0.0.1:{port}/healthz")
    return proc, port


async def bridges_up(
    port: int, n: int, http: aiohttp.ClientSession, tag: str, beat_s: float = 30.0
) -> list[FakeBridge]:
    url = f"ws://127.0.0.1:{port}/ws"
    bridges = [await FakeBridge(url, f"{tag}-{i}", http, beat_s).connect() for i in range(n)]
    await asyncio.sleep(0.3)  # REGISTERs processed
    return bridges


async def dispatch_and_lifecycle(
    cluster: Cluster, args: argparse.Namespace, http: aiohttp.ClientSession
) -> dict[str, Any]:
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 0}}})
    server, port = start_server(cluster, args.flood_limit, AIGCQ_SHARES=args.shares)
    bridges = await bridges_up(port, args.bridges, http, "life", args.heartbeat_s)
    try:
        await Load(port).run(min(500, args.tasks), None, "warm")
        dispatch, duplicates = [], 0
        for rate in (int(r) for r in args.rates.split(",")):
            paced = Load(port)
            n = max(1, int(rate * args.paced_s))
            await paced.run(n, rate, f"paced{rate}")
            duplicates += paced.duplicates
            assigned = {t: ts for b in bridges for t, ts in b.assigned.items()}
            lat = [(assigned[t] - paced.sent[t]) * 1000 for t in paced.sent if t in assigned]
            e2e = [(paced.done[t] - paced.sent[t]) * 1000 for t in paced.sent if t in paced.done]
            dispatch.append(
                {
                    "rate_per_s": rate,
                    "tasks": n,
                    "assigned": len(lat),
                    "submit_to_assign_p50_ms": pct(lat, 0.5),
                    "submit_to_assign_p99_ms": pct(lat, 0.99),
                    "submit_to_result_p50_ms": pct(e2e, 0.5),
                    "submit_to_result_p99_ms": pct(e2e, 0.99),
                }
            )
            print("dispatch", dispatch[-1], file=sys.stderr)
        flood = Load(port, clients=8)
        assert server.p is not None
        cpu = cpu_seconds(server.p.pid)
        elapsed = await flood.run(args.tasks, None, "flood")
        cpu = cpu_seconds(server.p.pid) - cpu
        lifecycle = {
            "bridges": args.bridges,
            "instances_each": SLOTS,
            "tasks": args.tasks,
            "results": sum(t.startswith("flood") for t in flood.done),
            "duplicates": flood.duplicates + duplicates,
            "seconds": round(elapsed, 3),
            "throughput_per_s": round(args.tasks / elapsed, 1),
            "server_cpu_ms_per_task": round(cpu * 1000 / args.tasks, 3),
            "flood_limit_per_bridge": args.flood_limit or "lifted",
        }
        print("lifecycle", lifecycle, file=sys.stderr)
        return {"dispatch": dispatch, "lifecycle": lifecycle}
    finally:
        for b in bridges:
            await b.close()
        server.stop()


class FakeRunningHub:
    """Answers ``/task/openapi/create`` and records when each request arrived."""

    def __init__(self) -> None:
        self.created: list[float] = []
        self.paid: set[str] = set()  # the taskIds of the creates
        self.arrived = asyncio.Event()
        app = web.Application()
        app.router.add_post("/task/openapi/create", self._create)
        self.runner = web.AppRunner(app, access_log=None)
        self.url = ""

    async def _create(self, request: web.Request) -> web.Response:
        self.created.append(now())
        hook = (await request.json()).get("webhookUrl", "")
        self.paid.update(parse_qs(urlsplit(hook).query).get("t", []))
        self.arrived.set()
        n = len(self.created)
        data = {"taskId": f"{1900000000000000000 + n}", "taskStatus": "RUNNING"}
        return web.json_response({"code": 0, "msg": "success", "data": data})

    async def start(self) -> FakeRunningHub:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self


async def bridge_loss(
    cluster: Cluster, args: argparse.Namespace, http: aiohttp.ClientSession
) -> dict[str, Any]:
    """One bridge serves a steady 200 tasks/s; its socket dies; when does RunningHub see one?"""
    rh = await FakeRunningHub().start()
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 100000}}})
    server, port = start_server(
        cluster,
        args.flood_limit,
        AIGCQ_RUNNINGHUB_URL=rh.url,
        AIGCQ_HEALTH_INTERVAL_S="0.1",
    )
    trials: list[float] = []
    internal_before: list[int] = []
    overflow_before: list[int] = []
    try:
        for trial in range(args.loss_trials):
            bridge = (await bridges_up(port, 1, http, f"loss{trial}", args.heartbeat_s))[0]
            await asyncio.sleep(0.5)  # 3 healthy checks at 0.1 s: internal again
            load = Load(port, clients=1)
            before = len(rh.created)
            runner = asyncio.create_task(load.run(300, 200, f"loss{trial}"))
            await asyncio.sleep(0.5)
            internal_before.append(len(bridge.assigned))
            overflow_before.append(len(rh.created) - before)
            t0 = now()
            bridge.abort()
            while not any(t > t0 for t in rh.created) and now() - t0 < 5:
                rh.arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(rh.arrived.wait(), 5)
            first = min((t for t in rh.created if t > t0), default=t0 + 5)
            trials.append((first - t0) * 1000)
            print(f"loss trial {trial}: {trials[-1]:.1f} ms", file=sys.stderr)
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
            await bridge.close()
        return {
            "trials": len(trials),
            "loss_to_first_overflow_ms": [round(t, 1) for t in trials],
            "median_ms": round(statistics.median(trials), 1),
            "max_ms": round(max(trials), 1),
            "internal_before_loss": internal_before,
            "overflowed_before_loss": overflow_before,
        }
    finally:
        server.stop()
        await rh.runner.cleanup()


async def recovery(
    cluster: Cluster, args: argparse.Namespace, http: aiohttp.ClientSession
) -> dict[str, Any]:
    """Issue 16's targets (< 1 s each), no paid overflow (tasks wait for internal capacity):

    * a bridge's socket drops and it reconnects: REGISTER → its first new TASK_ASSIGN;
    * a task's instance dies (its bridge reports an ``infrastructure`` failure): that
      TASK_END → the task's TASK_ASSIGN on another bridge."""
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 0}}})
    server, port = start_server(
        cluster,
        args.flood_limit,
        AIGCQ_HEALTH_INTERVAL_S="1",
        AIGCQ_BRIDGE_FAILURE_LIMIT="1",
    )
    url = f"ws://127.0.0.1:{port}/ws"
    reconnect: list[float] = []
    elsewhere: list[float] = []
    try:
        for trial in range(args.loss_trials):
            first = await FakeBridge(url, f"back{trial}", http, args.heartbeat_s).connect()
            await asyncio.sleep(0.2)
            first.abort()
            await asyncio.sleep(0.2)  # lost, degraded
            waiting = asyncio.create_task(Load(port, clients=1).run(3, None, f"back{trial}"))
            await asyncio.sleep(0.2)  # the tasks wait: no bridge, no paid platform
            again = await FakeBridge(url, f"back{trial}", http, args.heartbeat_s).connect()
            await waiting  # its tasks done: on the bridge, the only place they can run
            reconnect.append((min(again.assigned.values(), default=now()) - again.registered) * 1e3)
            await again.close()
            await first.close()
            # equally idle, more free slots: the dying bridge is picked first
            dying = await FakeBridge(url, f"dying{trial}", http, 30.0, failing=True).connect()
            other = await FakeBridge(url, f"other{trial}", http, 30.0, slots=SLOTS // 2).connect()
            await asyncio.sleep(0.2)
            await Load(port, clients=1).run(1, None, f"die{trial}")
            task_id = f"die{trial}-0"
            died = dying.ended.get(task_id, now())
            elsewhere.append((other.assigned.get(task_id, now()) - died) * 1e3)
            await other.close()
            await dying.close()
        return {
            "trials": len(reconnect),
            "reconnect_to_first_assign_ms": [round(t, 1) for t in reconnect],
            "instance_death_to_running_elsewhere_ms": [round(t, 1) for t in elsewhere],
        }
    finally:
        server.stop()


#: what instance B of the mixed run has: enough for this workflow, not for E2E_GRAPH's
#: ``ImageInvert``
BASIC_NODES = ("EmptyImage", "SaveImage")
BASIC_GRAPH = {
    "1": {
        "class_type": "EmptyImage",
        "inputs": {"width": 64, "height": 48, "batch_size": 1, "color": 0},
    },
    "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "b"}},
}
QUIET = ("--log-level", "WARNING")


async def mixed(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    """Mixed capabilities (see the module docstring): refusals, claims of the waiting
    special task, basic tasks' waits."""
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 0}}})
    server, port = start_server(cluster, args.flood_limit)
    everything = cluster.emulator("comfyui", "--step-time", "0.1", "--steps", "10", *QUIET)
    nodes = [f"--node={n}" for n in BASIC_NODES]
    basic = cluster.emulator("comfyui", "--step-time", "0.01", "--steps", "2", *nodes, *QUIET)
    _, bridge_port = cluster.bridge(port, [everything, basic])
    waits: list[float] = []
    ids: list[str] = []
    unstarted = 0
    async with httpx.AsyncClient(timeout=5.0) as http:
        await _until(lambda: _bridge_free(http, bridge_port, 2))
        await asyncio.sleep(0.5)  # the hub has its REGISTER
        client = await Client(port, "mixed").connect()
        try:
            for r in range(args.mixed_rounds):
                special = {"workflowId": "mixed-special", "workflow": E2E_GRAPH}
                await client.request(generate(f"long{r}", **special))
                await _until(lambda r=r: _running(http, everything, f"long{r}"))
                await client.request(generate(f"special{r}", **special))
                sent: dict[str, float] = {}
                for i in range(8):
                    task_id = f"basic{r}-{i}"
                    sent[task_id] = time.time()
                    payload = {"workflowId": "mixed-basic", "workflow": BASIC_GRAPH}
                    await client.request(generate(task_id, **payload))
                    await asyncio.sleep(args.mixed_pace_s)
                ids += [f"long{r}", f"special{r}", *sent]
                await client.collect(len(ids), timeout=60)
                for task_id, at in sent.items():
                    started = await _started(http, [everything, basic], task_id)
                    if started is None:  # no prompt of it in any history (yet): a figure
                        unstarted += 1
                        continue
                    waits.append((started - at) * 1000)
                print(
                    f"mixed round {r}: basic waits {[round(w) for w in waits[-8:]]} ms",
                    file=sys.stderr,
                )
            tasks = [await _task(http, port, task_id) for task_id in ids]
        finally:
            await client.close()
    server.stop()
    notes = [e.get("note", "") for t in tasks for e in t["timeline"]]
    return {
        "rounds": args.mixed_rounds,
        "basic_tasks": len(waits) + unstarted,
        "basic_not_started": unstarted,
        "results_ok": sum(1 for r in client.results.values() if r[0]["status"] == "success"),
        "tasks": len(ids),
        "refusals": sum(1 for note in notes if "refused" in note),
        "special_claims_max": max(t["attempt"] for t in tasks if t["taskId"].startswith("sp")),
        "basic_wait_p50_ms": pct(waits, 0.5) if waits else None,
        "basic_wait_p95_ms": pct(waits, 0.95) if waits else None,
        "basic_wait_max_ms": round(max(waits), 1) if waits else None,
    }


async def _until(probe: Any, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not await probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{probe} did not hold within {within} s")
        await asyncio.sleep(0.01)


async def _bridge_free(http: httpx.AsyncClient, port: int, free: int) -> bool:
    status = (await http.get(f"http://127.0.0.1:{port}/api/status")).json()
    connected = status["connection"]["state"] == "connected"
    return bool(connected and status["availableInstanceCount"] == free)


async def _running(http: httpx.AsyncClient, comfy: str, prompt_id: str) -> bool:
    queue = (await http.get(f"{comfy}/queue")).json()
    return any(item[1] == prompt_id for item in queue["queue_running"])


async def _started(http: httpx.AsyncClient, comfy: list[str], task_id: str) -> float | None:
    """When ``task_id``'s first prompt started, on any of those ComfyUIs (its
    ``execution_start``, epoch s; a later attempt's prompt is ``<taskId>-<attempt>``)."""
    starts = []
    for url in comfy:
        for prompt_id, entry in (await http.get(f"{url}/history")).json().items():
            if prompt_id == task_id or prompt_id.startswith(f"{task_id}-"):
                messages = entry["status"]["messages"]
                starts += [m[1]["timestamp"] for m in messages if m[0] == "execution_start"]
    return float(min(starts)) / 1000 if starts else None


async def _task(http: httpx.AsyncClient, port: int, task_id: str) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
    reply = await http.get(f"http://127.0.0.1:{port}/api/tasks/{task_id}", headers=auth)
    task: dict[str, Any] = reply.json()
    return task


async def new_bridge(
    cluster: Cluster, args: argparse.Namespace, http: aiohttp.ClientSession
) -> dict[str, Any]:
    """Issue 24.6 on two serve processes (a, b). RunningHub is configured at concurrency 1
    and never finishes, so once it holds one task the others wait in the queue (as they
    do when a paid platform is full), 10 submitted to each process. a's bridge is killed
    and a replacement with a new id registers with a; a's bridge is killed again, and b's
    bridge moves to a (its socket to b closed, the same id registers with a). For each:
    REGISTER → its first TASK_ASSIGN, and → every waiting task done. Default health
    settings (10 s checks, 3 to recover): a stability period would show as ~30 s."""
    rh = await FakeRunningHub().start()
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 1}}})
    servers = [start_server(cluster, args.flood_limit, AIGCQ_RUNNINGHUB_URL=rh.url)]
    servers.append(start_server(cluster, args.flood_limit, AIGCQ_RUNNINGHUB_URL=rh.url))
    (_, a), (_, b) = servers
    url_a, url_b = f"ws://127.0.0.1:{a}/ws", f"ws://127.0.0.1:{b}/ws"
    out: dict[str, list[float]] = {
        f"{kind}_{figure}": []
        for kind in ("replacement", "moved")
        for figure in ("register_to_first_assign_ms", "register_to_all_done_ms")
    }

    async def lose_a_bridge(tag: str) -> None:
        old = await FakeBridge(url_a, tag, http, args.heartbeat_s).connect()
        await asyncio.sleep(0.3)  # registered
        old.abort()  # as a kill leaves it
        await asyncio.sleep(0.3)  # a noticed: no bridge (degraded)

    async def measured(bridge: FakeBridge, kind: str, trial: int) -> None:
        loads = [Load(port, clients=1) for port in (a, b)]
        runners = [
            asyncio.create_task(load.run(10, None, f"{kind}{trial}-{i}"))
            for i, load in enumerate(loads)
        ]
        await asyncio.sleep(0.5)  # submitted: waiting (RunningHub is full)
        await bridge.connect()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(bridge.got_work.wait(), 40)
        first = min(bridge.assigned.values(), default=now())
        await asyncio.gather(*runners)
        done = max((t for load in loads for t in load.done.values()), default=now())
        ms = [(t - bridge.registered) * 1000 for t in (first, done)]
        out[f"{kind}_register_to_first_assign_ms"].append(round(ms[0], 1))
        out[f"{kind}_register_to_all_done_ms"].append(round(ms[1], 1))
        print(f"{kind} {trial}: first {ms[0]:.1f} ms, all {ms[1]:.1f} ms", file=sys.stderr)
        await bridge.close()

    try:
        filler = await Client(a, "filler").connect()  # RunningHub's one slot, for good
        await filler.send(generate("filler", workflowId="bench", nodeInfoList=[]))
        await asyncio.wait_for(rh.arrived.wait(), 10)
        await filler.close()
        for trial in range(args.loss_trials):
            await lose_a_bridge(f"gone{trial}")
            replacement = FakeBridge(url_a, f"new{trial}", http, args.heartbeat_s)
            await measured(replacement, "replacement", trial)
            await lose_a_bridge(f"lost{trial}")
            mover = await FakeBridge(url_b, f"mover{trial}", http, args.heartbeat_s).connect()
            await asyncio.sleep(0.3)  # registered with b
            await mover.close()
            await measured(
                FakeBridge(url_a, f"mover{trial}", http, args.heartbeat_s), "moved", trial
            )
        return {"trials": args.loss_trials, "paid_creates": len(rh.created), **out}
    finally:
        for proc, _ in servers:
            proc.stop()
        await rh.runner.cleanup()


def linear_pick(registry: BridgeRegistry) -> BridgeConn | None:
    """``BridgeRegistry.pick`` as it was before the index: a scan of every bridge."""
    candidates = [b for b in registry.bridges.values() if b.free() > 0]
    if not candidates:
        return None
    best = min((b.load(), -b.free()) for b in candidates)
    return random.choice([b for b in candidates if (b.load(), -b.free()) == best])


def routing_decision(n_bridges: int = 1000, rounds: int = 2000) -> dict[str, Any]:
    """One routing decision over ``n_bridges`` × ``SLOTS``, as a dispatch round makes it:
    ``routing.plan`` on the free-slot count, then pick a bridge and take its slot."""

    async def noop(_text: str) -> None:
        return None

    registry = BridgeRegistry(cast(Any, None), "bench", ttl_s=60)
    for i in range(n_bridges):
        conn = BridgeConn(f"b{i}", noop, SlotLedger(SLOTS, i % (SLOTS + 1)))
        registry.bridges[conn.bridge_id] = conn
    decide, picks, plan_only, linear = [], [], [], []
    for r in range(rounds):
        t = time.perf_counter_ns()
        split = plan(5000 + r, registry.free_slots(), 50)
        pick = registry.pick(f"wf{r % 10}")
        assert pick is not None
        assert pick.take(f"t{r}", Assignment(r, "bench", "comfyui"))  # TASK_ASSIGN's slot
        decide.append((time.perf_counter_ns() - t) / 1e6)
        pick.end(f"t{r}")  # TASK_END frees it again: the next round sees the same bridges
        t = time.perf_counter_ns()
        registry.pick()
        picks.append((time.perf_counter_ns() - t) / 1e6)
        t = time.perf_counter_ns()
        plan(5000 + r, 4000, 50)
        plan_only.append((time.perf_counter_ns() - t) / 1e6)
        if r < rounds // 10:
            t = time.perf_counter_ns()
            linear_pick(registry)
            linear.append((time.perf_counter_ns() - t) / 1e6)
    assert split.internal > 0
    capable = capable_pick(registry, rounds) | describing_choice(n_bridges, rounds // 10)
    return {
        "bridges": n_bridges,
        "instances_per_bridge": SLOTS,
        "plan_pick_take_slot_p50_ms": pct(decide, 0.5),
        "plan_pick_take_slot_p99_ms": pct(decide, 0.99),
        "plan_only_p50_us": round(statistics.median(plan_only) * 1000, 2),
        "pick_least_loaded_p50_ms": pct(picks, 0.5),
        "pick_least_loaded_p99_ms": pct(picks, 0.99),
        "linear_pick_p50_ms": pct(linear, 0.5),
        **capable,
    }


def describing_choice(n_bridges: int, rounds: int) -> dict[str, float]:
    """Bridges that describe their instances (one in ten has the special node class): a
    dispatch round's lookahead (the free instances listed, 8 free slots' worth + 32 waiting
    tasks weighed and matched, a tenth of them special), and a batch of 8 placed."""

    async def noop(_text: str) -> None:
        return None

    basic = Needs(frozenset({"EmptyImage", "SaveImage"}))
    special = Needs(basic.node_classes | {"ImageInvert"})
    registry = BridgeRegistry(cast(Any, None), "bench", ttl_s=60)
    for i in range(n_bridges):
        free = i % (SLOTS + 1)
        conn = BridgeConn(f"b{i}", noop, SlotLedger(SLOTS, free))
        offer = special if i % 10 == 0 else basic
        conn.describe(
            [
                InstanceInfo(
                    instance_id=f"b{i}-{k}",
                    url="http://comfy",
                    state="idle" if k < free else "busy",
                    task_id=None if k < free else f"other-{i}-{k}",
                    node_classes=sorted(offer.node_classes),
                )
                for k in range(SLOTS)
            ]
        )
        registry.bridges[conn.bridge_id] = conn
    waiting = [
        Candidate(f"t{j}", special if j % 10 == 0 else basic, Reach.BUSY, 1.0) for j in range(40)
    ]
    rules = Rules(8, None, 0.0, 60.0)
    chose, placed = [], []
    for _ in range(rounds):
        t = time.perf_counter_ns()
        chosen = choose(waiting, registry.free_spots(len(waiting)), rules)
        chose.append((time.perf_counter_ns() - t) / 1e6)
        assert len(chosen.ids) == 8
        t = time.perf_counter_ns()
        matching = Matching(registry.free_spots(8))
        for c in waiting[:8]:
            matching.add(c.needs)
        assert all(matching.spots())
        placed.append((time.perf_counter_ns() - t) / 1e6)
    return {
        "describing_lookahead_choose_p50_ms": pct(chose, 0.5),
        "describing_lookahead_choose_p99_ms": pct(chose, 0.99),
        "describing_place_batch_of_8_p50_ms": pct(placed, 0.5),
    }


def capable_pick(registry: BridgeRegistry, rounds: int) -> dict[str, float]:
    """A task only every 10th bridge can run (its model file): the least-loaded bridge
    cannot, so the pick scans the bridges with a free slot."""
    common = Needs(frozenset({"CheckpointLoaderSimple"}), frozenset({"a"}))
    rare = Needs(common.node_classes, frozenset({"a", "b"}))
    for i, conn in enumerate(registry.bridges.values()):
        conn.offers = (rare if i % 10 == 0 else common,)
    registry.offers_changed()
    needs_b = Needs(common.node_classes, frozenset({"b"}))
    times = []
    for r in range(rounds // 4):
        t = time.perf_counter_ns()
        pick = registry.pick(f"wf{r % 10}", needs_b)
        times.append((time.perf_counter_ns() - t) / 1e6)
        assert pick is not None and pick.can_run(needs_b)
    nowhere = Needs(common.node_classes, frozenset({"z"}))  # to the external platform
    unplaced = []
    for _ in range(rounds // 4):
        t = time.perf_counter_ns()
        assert registry.pick("wfz", nowhere) is None and not registry.anyone_can_run(nowhere)
        unplaced.append((time.perf_counter_ns() - t) / 1e6)
    return {
        "pick_capable_tenth_p50_ms": pct(times, 0.5),
        "pick_capable_tenth_p99_ms": pct(times, 0.99),
        "pick_nobody_capable_p50_ms": pct(unplaced, 0.5),
        "pick_nobody_capable_p99_ms": pct(unplaced, 0.99),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"host_python_ms": [python_speed_ms()]}
    if not (args.mixed_only or args.new_bridge_only or args.lifecycle_only):
        report["routing"] = routing_decision(rounds=args.routing_rounds)
        print("routing", report["routing"], file=sys.stderr)
    if args.routing_only:
        return report
    tmp = Path(tempfile.mkdtemp(prefix="aigcq-bridge-bench-"))
    redis = EmbeddedRedis(tmp / "redis", persist=False)
    cluster = Cluster(tmp, redis.start())
    connector = aiohttp.TCPConnector(limit=256)
    try:
        only = args.mixed_only or args.new_bridge_only
        async with aiohttp.ClientSession(connector=connector) as http:
            if args.lifecycle_only:
                report.update(await dispatch_and_lifecycle(cluster, args, http))
                report["host_python_ms"].append(python_speed_ms())
                return report
            if not args.mixed_only:
                report["new_bridge"] = await new_bridge(cluster, args, http)
                print("new_bridge", report["new_bridge"], file=sys.stderr)
            if not only:
                report.update(await dispatch_and_lifecycle(cluster, args, http))
                report["loss"] = await bridge_loss(cluster, args, http)
                report["recovery"] = await recovery(cluster, args, http)
                print("recovery", report["recovery"], file=sys.stderr)
        if not args.new_bridge_only:
            report["mixed"] = await mixed(cluster, args)
            print("mixed", report["mixed"], file=sys.stderr)
        report["host_python_ms"].append(python_speed_ms())
        return report
    finally:
        cluster.close()
        redis.stop()


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {
    "tasks": 60,
    "bridges": 2,
    "loss_trials": 1,
    "rates": "50",
    "paced_s": 0.5,
    "mixed_rounds": 1,
    "routing_rounds": 40,
    "mixed_pace_s": 0.05,
}

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", default="500,200", help="paced rates for dispatch latency")
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--bridges", type=int, default=20)
    parser.add_argument("--loss-trials", type=int, default=5)
    parser.add_argument(
        "--flood-limit", type=int, default=0, help="hub frames/s per bridge (0 = lifted)"
    )
    parser.add_argument(
        "--heartbeat-s", type=float, default=30.0, help="fake bridges' HEARTBEAT interval"
    )
    parser.add_argument("--routing-only", action="store_true", help="in-process routing only")
    parser.add_argument("--routing-rounds", type=int, default=2000, help="routing decisions")
    parser.add_argument("--paced-s", type=float, default=3.0, help="seconds of each paced rate")
    parser.add_argument("--mixed-only", action="store_true", help="mixed capabilities only")
    parser.add_argument("--mixed-rounds", type=int, default=3)
    parser.add_argument(
        "--mixed-pace-s", type=float, default=0.25, help="between the basic tasks' submits"
    )
    parser.add_argument(
        "--new-bridge-only", action="store_true", help="only the new and moved bridge trials"
    )
    parser.add_argument(
        "--lifecycle-only", action="store_true", help="only the dispatch and lifecycle figures"
    )
    parser.add_argument(
        "--shares", choices=("on", "off"), default="on", help="the serve's AIGCQ_SHARES"
    )
    print(json.dumps(asyncio.run(main(smoke.parse_args(parser, SMOKE))), indent=2))
