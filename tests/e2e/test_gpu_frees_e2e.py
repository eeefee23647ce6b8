"""Issue 42 item 9: nothing is paid while our GPU frees within a second.

Every piece a real process on 127.0.0.1: two ``aigcq serve`` on one Redis (A holds the
bridge), a RunningHub emulator that records every create and has room all along, and
either ``aigcq bridge`` (our agent) in front of two emulated ComfyUI instances, or, at the
protocol level, a two-instance bridge the test speaks for. Both instances run a task; then

* (a) one fails by the machine (the bridge's TASK_END says ``failure.class``
  ``infrastructure``), its TASK_END reaching serve A, the bridge's own process, the client
  on serve B: the retry runs on our GPU, the one just freed. With our agent (ComfyUI
  interrupted from outside) its CAPACITY comes before its TASK_END and this held on main
  too; a TASK_END that comes first, to a serve 20 ms farther from Redis than the client's,
  had the retry created on RunningHub 3 times out of 3.
* (b) the client cancels one and submits the next at once; the cancelled prompt lets its
  instance go 0.95 s later (ComfyUI's ``/interrupt`` takes about a second): the next task
  waits for that instance. Was: paid at once, the client on either serve; with a bridge
  that sends no CAPACITY, refused 421 once, then paid.

Each test runs three rounds and asserts that nothing was created on RunningHub.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis

from tests.e2e.test_two_serves_e2e import TwoServes, assigned, result, running, serves
from tests.fakes.bridge import INSTANCE_LOST, Bridge, post_task_end
from tests.fakes.client import Client, bridge_task, generate
from tests.fakes.processes import BRIDGE_TOKEN, Cluster
from tests.fakes.waiting import until

pytestmark = pytest.mark.e2e

#: one prompt of E2E_GRAPH: 3 nodes × 10 steps × 0.1 s = 3 s
STEP_TIME, STEPS = "0.1", "10"


@dataclass
class Fleet:
    cluster: Cluster
    rh: str
    comfy: list[str]
    serves: tuple[int, ...]  # A (the bridge's), B (the client's), any others
    redis: redis.Redis
    bridge_port: int

    def paid_creates(self) -> int:
        return int(httpx.get(f"{self.rh}/_emulator/stats").json()["created"])

    async def task(self, task_id: str) -> dict[str, str]:
        def read() -> dict[str, str]:
            return dict(self.redis.hgetall(f"aigcq:task:{task_id}"))

        return await asyncio.to_thread(read)

    async def until_task(self, task_id: str, **fields: str) -> dict[str, str]:
        """Until the task's hash has ``fields`` (``status``, ``attempt``, ``target``)."""
        return await until(
            lambda: self.task(task_id),
            lambda t: all(t.get(k) == v for k, v in fields.items()),
            30,
        )

    async def free_slots(self, free: int) -> None:
        """Until the bridge's record, and serve A's entry that serve B reads, show
        ``free`` free slots (both instances idle again between rounds)."""

        def ready() -> bool:
            ids = [k for k in self.redis.scan_iter("aigcq:bridge:*") if k.count(":") == 2]
            if len(ids) != 1:
                return False
            record = self.redis.hgetall(ids[0])
            if record.get("online") != "1" or record.get("availableInstanceCount") != str(free):
                return False
            entry = self.redis.hget("aigcq:internal:free", record.get("process", "")) or "0"
            return int(entry.split()[0]) == free

        await until(lambda: asyncio.to_thread(ready), bool, 30)

    async def running_on(self) -> dict[str, str]:
        """Which task runs on which ComfyUI (its URL), as the bridge says."""
        async with httpx.AsyncClient() as http:
            port = self.bridge_port
            status = (await http.get(f"http://127.0.0.1:{port}/api/status")).json()
        urls = {i.get("instanceId", i.get("instance_id")): i["url"] for i in status["instances"]}
        return {t["taskId"]: urls[t["instanceId"]] for t in status["tasks"]}


@contextlib.contextmanager
def fleet(
    cluster: Cluster, *comfy_args: str, serves: int = 2, far_s: float = 0.0
) -> Iterator[Fleet]:
    """Serves on one Redis, the bridge (2 ComfyUI emulators) on the first; with ``far_s``,
    the first reaches Redis through a link that delays each way by that much."""
    c = cluster
    with ThreadPoolExecutor() as pool:  # start-up is CPU-bound imports: overlap them
        rh_f = pool.submit(c.emulator, "runninghub", "--max-concurrent", "5", "--duration", "60")
        args = ("--step-time", STEP_TIME, "--steps", STEPS, *comfy_args)
        comfy_f = [pool.submit(c.emulator, "comfyui", *args) for _ in range(2)]
        rh, comfy = rh_f.result(), [f.result() for f in comfy_f]
    c.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 5}}})
    env = {"AIGCQ_RUNNINGHUB_URL": rh, "AIGCQ_HEALTH_INTERVAL_S": "0.2"}
    link = SlowLink(c.redis_url, far_s) if far_s else None
    first = {"AIGCQ_REDIS_URL": link.url} if link else {}
    with ThreadPoolExecutor() as pool:
        started = [pool.submit(c.server, **env, **(first if i == 0 else {})) for i in range(serves)]
        procs, ports = zip(*(f.result() for f in started), strict=True)
    _, bridge_port = c.bridge(ports[0], comfy, "--heartbeat=0.5")
    client = redis.Redis.from_url(c.redis_url, decode_responses=True)
    f = Fleet(c, rh, comfy, ports, client, bridge_port)
    try:
        asyncio.run(f.free_slots(2))
        yield f
    finally:
        client.close()
        if link is not None:
            procs[0].stop()  # before its link to Redis goes
            link.close()


async def submitted(client: Client, task_id: str) -> None:
    reply = await client.request(bridge_task(task_id))
    assert reply["type"] == "submitted", reply
    client.replies.clear()


async def results(f: Fleet, client: Client, ids: list[str]) -> dict[str, dict[str, Any]]:
    while not all(i in client.results for i in ids):
        try:
            await client.next(timeout=30)
        except TimeoutError:
            tasks = {i: await f.task(i) for i in ids if i not in client.results}
            raise AssertionError(f"results of {ids}: none of {tasks}") from None
    return {i: client.results[i][-1] for i in ids}


async def both_running(f: Fleet, client: Client, ids: list[str]) -> dict[str, str]:
    for task_id in ids:
        await submitted(client, task_id)
    for task_id in ids:
        await f.until_task(task_id, status="running", target="bridge")
    where = await until(f.running_on, lambda got: all(i in got for i in ids), 10)
    assert where[ids[0]] != where[ids[1]], where
    return where


def test_a_machine_failure_reported_to_the_bridges_own_serve_is_retried_on_our_gpu(
    cluster: Cluster,
) -> None:
    with fleet(cluster) as f:
        asyncio.run(_machine_failures(f))


async def _machine_failures(f: Fleet) -> None:
    client = await Client(f.serves[1], "biz-a").connect()
    for r in range(3):
        ids = [f"a{r}-fails", f"a{r}-runs"]
        where = await both_running(f, client, ids)
        async with httpx.AsyncClient() as http:  # a machine's failure: stopped from outside
            assert (await http.post(f"{where[ids[0]]}/interrupt", json={})).status_code == 200
        retry = await f.until_task(ids[0], attempt="2")
        assert retry["target"] in ("", "bridge"), retry  # waiting, or on our GPU
        got = await results(f, client, ids)
        assert {i: got[i]["status"] for i in ids} == dict.fromkeys(ids, "success")
        assert (await f.task(ids[0]))["target"] == "bridge"
        assert f.paid_creates() == 0, f"round {r}: the retry was paid"
        await f.free_slots(2)
    await client.close()


@pytest.mark.parametrize(
    ("serve", "serves", "far_s"),
    [(0, 2, 0.0), (1, 2, 0.0), (1, 3, 0.03)],
    ids=["on-the-bridges-serve", "on-the-other", "a-third-serve-beside"],
)
def test_the_next_task_waits_for_the_instance_a_cancel_frees(
    cluster: Cluster, serve: int, serves: int, far_s: float
) -> None:
    """The client cancels on ``serve``. With a third serve, which holds neither the bridge
    nor the client, and the bridge's serve 30 ms farther from Redis (it writes its free
    slots last): the third may plan the next task before that write, and must know from
    the cancel's ``bridge-end`` that the slot is about to be free (was: paid)."""
    with fleet(cluster, "--interrupt-latency", "0.95", serves=serves, far_s=far_s) as f:
        asyncio.run(_cancels(f, serve))


async def _cancels(f: Fleet, serve: int) -> None:
    client = await Client(f.serves[serve], "biz-b").connect()
    for r in range(3):
        ids = [f"b{r}-cancelled", f"b{r}-runs"]
        await both_running(f, client, ids)
        await client.send({"type": "cancel", "taskId": ids[0]})
        await client.send(bridge_task(f"b{r}-next"))  # at once, its answer not awaited
        while len(client.replies) < 2:
            await client.next()
        assert [m["type"] for m in client.replies] == ["cancelled", "submitted"], client.replies
        client.replies.clear()
        nxt = await until(partial(f.task, f"b{r}-next"), lambda t: bool(t.get("target")), 30)
        assert nxt["target"] == "bridge", f"round {r}: the next task went to {nxt['target']}"
        got = await results(f, client, [*ids, f"b{r}-next"])
        assert got[ids[0]]["status"] == "cancelled"
        assert got[ids[1]]["status"] == "success"
        assert got[f"b{r}-next"]["status"] == "success"
        assert (await f.task(f"b{r}-next"))["target"] == "bridge"
        assert f.paid_creates() == 0, f"round {r}: the next task was paid"
        await f.free_slots(2)
    await client.close()


class SlowLink:
    """A TCP proxy in front of Redis that delays every chunk by ``delay_s`` each way, in
    order: a serve farther from Redis than the others (another zone), in its own thread
    (the test's loop blocks while processes start)."""

    def __init__(self, upstream_url: str, delay_s: float) -> None:
        self.upstream, self.delay_s = urlsplit(upstream_url), delay_s
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.server: asyncio.Server | None = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.server, self.port = server, server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    def close(self) -> None:
        async def stop() -> None:
            if self.server is not None:
                self.server.close()
            links = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in links:
                task.cancel()
            await asyncio.gather(*links, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.upstream.scheme == "unix":
            up_reader, up_writer = await asyncio.open_unix_connection(self.upstream.path)
        else:
            host, port = self.upstream.hostname, self.upstream.port
            up_reader, up_writer = await asyncio.open_connection(host, port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

            async def later() -> None:
                while True:
                    at, data = await chunks.get()
                    await asyncio.sleep(max(at - time.monotonic(), 0.0))
                    if not data:
                        dst.close()
                        return
                    dst.write(data)
                    await dst.drain()

            sender = asyncio.ensure_future(later())
            while data := await src.read(1 << 16):
                chunks.put_nowait((time.monotonic() + self.delay_s, data))
            chunks.put_nowait((time.monotonic() + self.delay_s, b""))
            await sender

        with contextlib.suppress(ConnectionError):
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_a_machine_failure_heard_by_a_serve_far_from_redis_is_retried_on_our_gpu(
    cluster: Cluster,
) -> None:
    """(a) at the protocol level, serve A 20 ms farther from Redis than serve B (another
    zone): both instances of a two-instance bridge on serve A run a task, the client is on
    serve B; one fails by the machine and its TASK_END reaches serve A before the bridge's
    CAPACITY (a webhook and a socket race; a bridge that reports no capacity always
    does). Its retry runs on the bridge, three rounds, nothing paid (was: the retry,
    queued before serve A had written its free slot, planned by serve B for RunningHub,
    3 of 3)."""
    link = SlowLink(cluster.redis_url, 0.02)
    rh = cluster.emulator("runninghub", "--max-concurrent", "5", "--duration", "60")
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 5}}})
    far, a = cluster.server(AIGCQ_RUNNINGHUB_URL=rh, AIGCQ_REDIS_URL=link.url)
    _, b = cluster.server(AIGCQ_RUNNINGHUB_URL=rh)
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    try:
        await _retried_on_the_bridge(TwoServes(cluster, rh, (a, b), client))
    finally:
        client.close()
        far.stop()  # before its link to Redis goes
        link.close()


async def _retried_on_the_bridge(two: TwoServes) -> None:
    bridge = await Bridge.connect(two.ports[0], BRIDGE_TOKEN)
    await bridge.register("two-instances", count=2)
    await two.until_redis("2", "HGET", "aigcq:bridge:two-instances", "availableInstanceCount")
    process = two.redis.hget("aigcq:bridge:two-instances", "process") or ""
    await until(
        lambda: asyncio.to_thread(two.redis.hget, "aigcq:internal:free", process),
        lambda entry: entry is not None and entry.split()[0] == "2",
        10,
    )
    client = await Client(two.ports[1], "biz-proto").connect()
    for r in range(3):
        fails, runs = f"p{r}-fails", f"p{r}-runs"
        await client.request(generate(fails))
        hook = (await assigned(bridge, fails))["webhookUrl"]
        await client.request(generate(runs))
        other = (await assigned(bridge, runs))["webhookUrl"]
        await running(two, fails, 1)
        await running(two, runs, 1)
        assert await post_task_end(two.base(0), hook, code=1, failure=INSTANCE_LOST) == 200
        retry = await until(
            partial(asyncio.to_thread, two.redis.hgetall, f"aigcq:task:{fails}"),
            lambda t: t.get("attempt") == "2" and bool(t.get("target")),
            10,
        )
        assert retry["target"] == "bridge", f"round {r}: the retry went to {retry['target']}"
        hook = (await assigned(bridge, fails))["webhookUrl"]
        await running(two, fails, 2)
        assert await post_task_end(two.base(0), hook) == 200
        assert await post_task_end(two.base(0), other) == 200
        assert (await result(client, fails))["status"] == "success"
        assert (await result(client, runs))["status"] == "success"
        assert two.paid_creates() == 0, f"round {r}: the retry was paid"
    await client.close()


async def test_a_refusal_by_a_bridge_still_stopping_a_cancelled_prompt_waits_for_it(
    cluster: Cluster,
) -> None:
    """(b) at the protocol level, with a bridge that sends no CAPACITY (a seed-style
    bridge, reporting its held tasks in its HEARTBEATs and refusals): two instances run a
    task each, the client cancels one and submits the next at once. The hub, not told
    when the instance is free, offers it the next task; the bridge, still stopping the
    cancelled prompt, refuses it (421, with its counts: the cancelled task still held).
    The next task waits for that instance and runs there once the bridge's HEARTBEAT says
    it is free, 0.95 s later: three rounds, nothing paid (was: refused once, then paid)."""
    with serves(cluster) as two:
        bridge = await Bridge.connect(two.ports[0], BRIDGE_TOKEN)
        await bridge.register("seed-style", count=2, tasks=[])
        await two.until_redis("2", "HGET", "aigcq:bridge:seed-style", "availableInstanceCount")
        client = await Client(two.ports[0], "biz-seed").connect()
        for r in range(3):
            cancelled, runs, nxt = f"s{r}-cancelled", f"s{r}-runs", f"s{r}-next"
            await client.request(generate(cancelled))
            await assigned(bridge, cancelled)
            await client.request(generate(runs))
            hook = (await assigned(bridge, runs))["webhookUrl"]
            await running(two, cancelled, 1)
            await running(two, runs, 1)
            await client.send({"type": "cancel", "taskId": cancelled})
            await client.send(generate(nxt))
            stop = await bridge.next(timeout=10)
            assert stop["type"] == "TASK_CANCEL", stop
            frees_at = time.monotonic() + 0.95  # its instance lets the prompt go then
            held = [cancelled, runs]
            while True:
                left = frees_at - time.monotonic()
                try:
                    msg = await bridge.next(timeout=max(left, 0.01))
                except TimeoutError:
                    break
                assert (msg["type"], msg["data"]["taskId"]) == ("TASK_ASSIGN", nxt), msg
                counts = {"instanceCount": 2, "availableInstanceCount": 0, "tasks": held}
                data = {"taskId": nxt, "attempt": msg["data"]["attempt"]}
                await bridge.send("TASK_ACK", {"code": 421, "msg": "busy", "data": data, **counts})
            task = await asyncio.to_thread(two.redis.hgetall, f"aigcq:task:{nxt}")
            assert task.get("target") != "runninghub", f"round {r}: the next task was paid"
            beat = {"instanceCount": 2, "availableInstanceCount": 1, "tasks": [runs]}
            await bridge.send("HEARTBEAT", beat)
            later = (await assigned(bridge, nxt))["webhookUrl"]
            await running(two, nxt, await two_attempt(two, nxt))
            assert await post_task_end(two.base(0), later) == 200
            assert await post_task_end(two.base(0), hook) == 200
            await bridge.send("HEARTBEAT", {"instanceCount": 2, "availableInstanceCount": 2})
            while not all(t in client.results for t in (cancelled, runs, nxt)):
                await client.next(timeout=15)
            got = {t: client.results[t][-1]["status"] for t in (cancelled, runs, nxt)}
            assert got == {cancelled: "cancelled", runs: "success", nxt: "success"}, got
            assert two.paid_creates() == 0, f"round {r}: the next task was paid"
        await client.close()


async def two_attempt(two: TwoServes, task_id: str) -> int:
    """The task's live attempt."""
    return int(await asyncio.to_thread(two.redis.hget, f"aigcq:task:{task_id}", "attempt") or 0)
