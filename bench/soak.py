"""Soak run (issue 42; seed 000 §5.4's 24 hours of stable running, compressed by volume):
``--tasks`` tasks through two ``aigcq serve`` processes on one Redis, a bridge per serve
(``aigcq bridge`` in front of ComfyUI emulators) and a RunningHub emulator for the
overflow, its webhooks through a front that reaches whichever serve is up
(:mod:`bench.front`). Every ``--kill-every`` tasks submitted, one serve is SIGKILLed
and started again on its port about a second later, and the other serve's bridge is
SIGKILLed and started again (same port and data dir: the same bridge id); the next time,
the other serve and bridge. The parts are the chaos run's (:mod:`bench.chaos`): the
same client (one business backend over WebSocket to either serve, ``ack=1``, resending
what was not acknowledged when it reconnects), the same tasks and the same figures.

The load is paced at ``--rate`` tasks a second with at most ``--in-flight`` tasks
submitted and not yet ended, so it never builds a backlog the fleet cannot drain. Task
results expire ``--retention-s`` after they end (``AIGCQ_RESULT_RETENTION_S`` and
``AIGCQ_OUTBOX_RETENTION_S``, a day in production): the volume of a day goes through in
minutes, so the retention is compressed with it, and Redis reaches its steady state.

Every ``--sample-every`` tasks submitted (before that point's kill) it samples, and
prints to stderr: tasks submitted and ended, in flight, each serve's RSS
(``/proc/<pid>/status`` VmRSS) and open sockets (socket fds in ``/proc/<pid>/fd``),
Redis ``used_memory`` and its key count. At the end it prints JSON: the samples;
``lost`` (submitted, never ended for the client), ``duplicated`` (two different results
for one task, a late success after an ``UncertainSubmit`` failure aside), ``double_paid``
(created on RunningHub twice), ``paid_but_failed``, ``charged_not_billed``,
``leaked_slots`` (as in the chaos run; all must be 0); and ``flat``: per series (each
serve's RSS and sockets, both serves' sockets, Redis memory and its bytes per key),
whether every sample after the warm-up (the first two dropped) is within 10 % of their
median, and how far the farthest is — computed and reported, not asserted; ``all``
leaves out each serve's own socket count, which moves at every kill (the front's
kept-alive webhook connections and the client go over to the serve that stayed up:
``socket_kinds`` splits them into accepted, made, and the rest). Redis holds the tasks
of the last ``--retention-s``, so its memory follows the rate the host allowed; per key
it should not move. A serve's RSS falls at the kill that restarts it: each sample names
each serve's pid.

The client's own bookkeeping is a byte and a hash per task (no per-task lists), so a
run of 1,000,000 tasks keeps it to about 10 MB.

    python bench/soak.py [--tasks 1000000] [--kill-every 100000] [--sample-every 50000]
                         [--rate 200] [--in-flight 400] [--retention-s 60]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import host, smoke
from bench.chaos import (
    KEY,
    Chaos,
    Load,
    billed,
    charged,
    charges_due,
    failures,
    leaked_slots,
    records,
    rh_stats,
)
from bench.front import Front
from bench.processes import Cluster

from aigcq.embedded.redis import EmbeddedRedis
from aigcq.emulators._records import paid_runs

#: the paid account's concurrency (RunningHub's own cap for the key too)
CAP = 8
#: ComfyUI emulators per bridge, and how long a node of theirs runs
INSTANCES = 2
STEPS, STEP_TIME = 1, 0.02
#: how long a RunningHub task runs
PAID_DURATION_S = 0.2
#: the samples dropped as warm-up before the flatness is judged, and how flat is flat
WARM_UP, FLAT = 2, 0.10
#: a task's state as the client saw it: none yet, success, failed
NONE, SUCCESS, FAILED = 0, 1, 2


class Tally(Load):
    """The chaos run's client (:class:`bench.chaos.Load`: reconnects to either serve,
    resends what was not acknowledged, acknowledges every result), keeping per task a
    byte (its result's status) and a hash (the outbox entry its first result came as)
    instead of lists of messages, and pacing its submits under a cap on tasks in flight.
    Task ``i`` is ``soak-i``."""

    def __init__(self, ports: list[int], rate: float, tasks: int, in_flight: int) -> None:
        super().__init__(ports, rate)
        self.tasks, self.cap = tasks, in_flight
        self.state = bytearray(tasks)
        self.first = array("q", bytes(8 * tasks))  # hash of the first result's entry id
        self.sent = 0  # tasks submitted so far (soak-0 .. soak-<sent - 1>)
        self.ended = 0  # tasks with a result
        self.redelivered = 0  # the same entry again (at least once: not a failure)
        self.duplicated: set[int] = set()  # two different entries
        self.late_success: set[int] = set()  # a late success after a failure
        self.codes: Counter[str] = Counter()  # why tasks failed, by code
        self.failed: set[int] = set()  # tasks whose (last) result is a failure
        self._freed = asyncio.Event()

    @property
    def in_flight(self) -> int:
        return self.sent - self.ended

    async def _on(self, msg: dict[str, Any]) -> None:
        if msg["type"] != "result":
            await super()._on(msg)
            return
        task_id = msg.get("taskId", "")
        self.unacked.discard(task_id)  # it was taken, whatever became of the reply
        await self._send({"type": "ack", "id": msg["id"]})
        i = int(task_id.rpartition("-")[2])
        entry = hash(msg["id"]) or 1
        success = msg["status"] == "success"
        if self.first[i] == 0:
            self.first[i] = entry
            self.ended += 1
            self._freed.set()
        elif self.first[i] == entry:
            self.redelivered += 1
            return
        elif success and msg.get("late") is True and self.state[i] == FAILED:
            self.late_success.add(i)
        else:
            self.duplicated.add(i)
        self.state[i] = SUCCESS if success else FAILED
        if success:
            self.failed.discard(i)
        else:
            self.failed.add(i)
            self.codes[str(msg.get("code"))] += 1

    async def run(self, on_sent: Any) -> None:
        """Submit every task at ``rate`` a second, never more than ``cap`` in flight;
        ``on_sent(n)`` after the ``n``-th (awaited)."""
        start = time.monotonic()
        while self.sent < self.tasks:
            while self.in_flight >= self.cap:
                self._freed.clear()
                await self._freed.wait()
            task_id = f"soak-{self.sent}"
            self.unacked.add(task_id)
            self.sent += 1
            await self._send(self.message(task_id))
            await on_sent(self.sent)
            ahead = start + self.sent / self.rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
            elif self.sent % 100 == 0:
                await asyncio.sleep(0)  # let the reader in

    def lost(self) -> int:
        return self.sent - self.ended


def sockets(pid: int, port: int) -> dict[str, int]:
    """The process's open socket fds, by kind: TCP connections accepted on ``port``
    (``in``: the client, the bridge, webhooks through the front), TCP connections it
    made (``out``: RunningHub, bridges' files), and the rest (``other``: Redis's Unix
    socket, the listening socket)."""
    tcp: dict[str, tuple[int, str]] = {}  # inode -> (local port, state)
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                cols = line.split()
                tcp[cols[9]] = (int(cols[1].rpartition(":")[2], 16), cols[3])
    kinds = {"in": 0, "out": 0, "other": 0}
    with contextlib.suppress(OSError):
        for fd in os.scandir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(fd.path)
                if not link.startswith("socket:["):
                    continue
                local, state = tcp.get(link[8:-1], (0, ""))
                if not state or state == "0A":  # not TCP, or listening
                    kinds["other"] += 1
                else:
                    kinds["in" if local == port else "out"] += 1
    return kinds


class Soak:
    """The run: the chaos run's processes (:class:`bench.chaos.Chaos`: serves, their
    bridges, the RunningHub emulator behind a front), a kill every ``kill_every`` tasks,
    a sample every ``sample_every``."""

    def __init__(self, chaos: Chaos, load: Tally, args: argparse.Namespace) -> None:
        self.chaos, self.load, self.args = chaos, load, args
        self.redis = aioredis.Redis.from_url(chaos.cluster.redis_url, decode_responses=True)
        self.samples: list[dict[str, Any]] = []
        self.kills: list[dict[str, Any]] = []
        self._killing: asyncio.Task[None] | None = None
        self.started = time.monotonic()

    async def on_sent(self, n: int) -> None:
        if n % self.args.sample_every == 0 or n == self.args.tasks:
            await self.sample()
        if n % self.args.kill_every == 0 and n < self.args.tasks:
            if self._killing is not None:
                await self._killing  # the last one's restarts first
            self._killing = asyncio.create_task(self.kill(len(self.kills)))

    async def kill(self, k: int) -> None:
        """The ``k``-th kill: serve ``k % 2`` (back on its port ~1 s later) and the other
        serve's bridge (back at once), together; done once both are up and registered."""
        at_task = self.load.sent
        ports = sorted(self.chaos.serves)
        port = ports[k % 2]
        bridge = next(b for b in self.chaos.fleet.bridges if b.server_port != port)
        struck = time.monotonic()
        rng = random.Random(k)
        await asyncio.gather(
            self.chaos.kill_serve(port, 1.0), self.chaos.fleet.kill_one(rng, bridge)
        )
        await self.chaos.fleet.registered()
        self.kills.append(
            {
                "at_task": at_task,
                "serve": port,
                "bridge": bridge.port,
                "back_s": round(time.monotonic() - struck, 2),
            }
        )

    async def sample(self) -> None:
        """One row of figures, read once the last kill's processes are back."""
        if self._killing is not None:
            await self._killing
        serves = {str(port): proc.p.pid for port, proc in self.chaos.serves.items() if proc.p}
        memory = await self.redis.info("memory")
        fds = {port: sockets(pid, int(port)) for port, pid in serves.items()}
        row = {
            "tasks": self.load.sent,
            "ended": self.load.ended,
            "in_flight": self.load.in_flight,
            "s": round(time.monotonic() - self.started, 1),
            "rss_kb": {port: host.rss_kib(pid) for port, pid in serves.items()},
            "sockets": {port: sum(kinds.values()) for port, kinds in fds.items()},
            "socket_kinds": fds,
            "redis_used_memory": int(memory["used_memory"]),
            "redis_keys": int(await self.redis.dbsize()),
            "pids": serves,
        }
        self.samples.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    async def settle(self, within: float) -> None:
        """Until every task ended for the client, nothing is left running on RunningHub
        or counted against a cap, and every bridge slot is free; at most ``within`` s."""
        if self._killing is not None:
            await self._killing
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            await self.load.resend_unacked()
            stats = await rh_stats(self.chaos.rh)
            sent = stats["webhooks_delivered"] + stats["webhooks_failed"]
            # the stats, not every create's record (half a million at full size)
            running = sum(stats["current"].values()) + billed(stats) - sent
            if self.load.lost() == 0 and running == 0:
                with contextlib.suppress(RedisError, OSError):
                    leaked = await leaked_slots(self.chaos.cluster.redis_url)
                    leaked += await charges_due(self.chaos.cluster.redis_url)
                    if leaked == 0 and not any((await self.chaos.fleet.slots_taken()).values()):
                        return
            await asyncio.sleep(1.0)


def flatness(series: list[float]) -> dict[str, Any]:
    """Whether every value after the warm-up is within :data:`FLAT` of their median."""
    after = series[WARM_UP:]
    if not after:
        return {"flat": None, "median": None, "max_off_pct": None}
    median = statistics.median(after)
    off = max(abs(v - median) for v in after) / median if median else 0.0
    return {"flat": off <= FLAT, "median": median, "max_off_pct": round(off * 100, 1)}


def flat(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`flatness` of each series: each serve's RSS and sockets, both serves'
    sockets, Redis memory; ``all``: whether every one is flat but each serve's sockets."""
    out: dict[str, Any] = {
        f"{what}_{port}": flatness([s[what][port] for s in samples])
        for what in ("rss_kb", "sockets")
        for port in samples[0][what]
    }
    out["sockets_both"] = flatness([sum(s["sockets"].values()) for s in samples])
    out["redis_used_memory"] = flatness([s["redis_used_memory"] for s in samples])
    # what Redis holds is the tasks of the last retention window, so it follows the rate
    # the host allowed; per key it does not
    per_key = [s["redis_used_memory"] / max(s["redis_keys"], 1) for s in samples]
    out["redis_bytes_per_key"] = flatness([round(b) for b in per_key])
    # a serve's share of the sockets moves at each kill (the front's kept-alive webhook
    # connections and the client go over to the serve that stayed up): judged together
    judged = [v for k, v in out.items() if not k.startswith("sockets_") or k == "sockets_both"]
    out["all"] = all(v["flat"] is not False for v in judged)
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    yardstick = [host.python_speed_ms()]
    tmp = Path(tempfile.mkdtemp(prefix="aigcq-soak-"))
    redis = EmbeddedRedis(tmp / "redis", persist=True)
    cluster = Cluster(tmp, redis.start())
    front = Front()
    started = time.monotonic()
    try:
        rh = cluster.emulator(
            "runninghub", "--max-concurrent", str(CAP), "--duration", str(args.paid_duration)
        )
        cluster.write_models({"proj": {"comfyui": {"apikey": KEY, "concurrency": CAP}}})
        ports: list[int] = []
        load = Tally(ports, args.rate, args.tasks, args.in_flight)
        retention = str(int(args.retention_s))
        env = {"AIGCQ_RESULT_RETENTION_S": retention, "AIGCQ_OUTBOX_RETENTION_S": retention}
        chaos = Chaos(cluster, redis, rh, load, seed=0, faults=(), serve_env=env)
        chaos.callback_url = f"http://127.0.0.1:{await front.start()}"
        ports += [chaos.start_serve(), chaos.start_serve()]
        front.backends = ports
        await asyncio.to_thread(
            chaos.fleet.start, ports, [INSTANCES, INSTANCES], None, STEPS, args.step_time
        )
        await chaos.fleet.registered()
        soak = Soak(chaos, load, args)
        reader = asyncio.create_task(load.read())
        await load.run(soak.on_sent)
        loaded_s = time.monotonic() - soak.started
        await soak.settle(args.drain)
        await soak.sample()  # once everything ended
        reader.cancel()
        recs = await records(rh)
        runs = paid_runs(recs)
        paid_failed = [t for t in runs if int(t.rpartition("-")[2]) in load.failed]
        billing = billed(await rh_stats(rh))
        charges = await charged(cluster.redis_url)
        bridge_slots = await chaos.fleet.slots_taken()
        await soak.redis.aclose()
        yardstick.append(host.python_speed_ms())
        return {
            "seconds": round(time.monotonic() - started, 1),
            "tasks": load.sent,
            "rate_sustained": round(load.sent / loaded_s, 1),
            "lost": load.lost(),
            "duplicated": len(load.duplicated),
            "double_paid": sum(1 for n in runs.values() if n > 1),
            "paid_but_failed": len(paid_failed),
            "charged_not_billed": abs(charges - billing),
            "leaked_slots": await leaked_slots(cluster.redis_url)
            + sum(r["current"] for r in recs.values())
            + sum(bridge_slots.values()),
            "redelivered": load.redelivered,
            "paid_late_success": sum(1 for i in load.late_success if f"soak-{i}" in runs),
            "outcomes": {
                "success": sum(1 for s in load.state if s == SUCCESS),
                "failed": len(load.failed),
            },
            "failures": dict(load.codes),
            "failed_tasks": [f"soak-{i}" for i in sorted(load.failed)[:20]],
            "paid_runs": sum(runs.values()),
            "billed_runs": billing,  # the runs RunningHub ended
            "charged_runs": charges,  # the runs aigcq's spend counts
            "kills": soak.kills,
            "flat": flat(soak.samples[:-1]),
            "samples": soak.samples[:-1],
            "settled": soak.samples[-1],
            "host_python_ms": yardstick,
        }
    finally:
        await front.close()
        cluster.close()
        redis.stop()


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"tasks": 60, "kill_every": 30, "sample_every": 20, "rate": 20.0, "drain": 60.0}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--kill-every", type=int, default=100_000, help="tasks between kills")
    parser.add_argument("--sample-every", type=int, default=50_000, help="tasks between samples")
    parser.add_argument("--rate", type=float, default=200.0, help="tasks submitted a second")
    parser.add_argument("--in-flight", type=int, default=400, help="most tasks not yet ended")
    parser.add_argument(
        "--retention-s", type=float, default=60.0, help="results kept after they end (s)"
    )
    parser.add_argument("--step-time", type=float, default=STEP_TIME, help="a ComfyUI step (s)")
    parser.add_argument(
        "--paid-duration", type=float, default=PAID_DURATION_S, help="a RunningHub task (s)"
    )
    parser.add_argument("--drain", type=float, default=300.0, help="most seconds to settle")
    return smoke.parse_args(parser, SMOKE, argv)


if __name__ == "__main__":
    soaked = asyncio.run(main(parse()))
    print(json.dumps(soaked, indent=2))
    sys.exit(1 if failures(soaked) else 0)  # a figure that must be 0 is not
