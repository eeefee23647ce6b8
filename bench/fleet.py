"""Our own GPUs in the chaos run: ``aigcq bridge`` processes in front of emulated ComfyUI
instances, one bridge per serve, SIGKILLed and restarted at random (same port and data
dir, so the same bridge id, re-registering with the prompts it held).

After the run every slot must be free, as each side sees it: the hub holding the bridge's
socket (``GET /api/admin/snapshot``: free == instances, nothing running or pending) and
the bridge itself (``GET /api/status``: no task, nothing spooled, connected).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
from bench.processes import ADMIN_TOKEN, Cluster, Proc

#: a prompt of the chaos tasks' graph (3 nodes) takes 3 x STEPS x STEP_TIME on an instance
STEPS, STEP_TIME = 2, 0.1
BRIDGE_ARGS = ("--heartbeat=0.5",)
BRIDGE_ENV = {"AIGCQ_BRIDGE_HEALTH_INTERVAL": "0.5", "AIGCQ_BRIDGE_WS_SILENCE": "2"}


@dataclass
class Bridge:
    server_port: int
    comfyui: list[str]
    port: int = 0
    proc: Proc | None = None
    bridge_id: str = ""


@dataclass
class Fleet:
    """Bridges, each in front of its own ComfyUI emulators, attached to given serves."""

    cluster: Cluster
    bridges: list[Bridge] = field(default_factory=list)
    #: the instances that have only some node classes
    basic: frozenset[str] = frozenset()

    def start(
        self,
        server_ports: list[int],
        instances: list[int],
        nodes: dict[tuple[int, int], tuple[str, ...]] | None = None,
        steps: int = STEPS,
        step_time: float = STEP_TIME,
    ) -> None:
        """One bridge per serve, ``instances[i]`` ComfyUI emulators behind bridge ``i``;
        ``nodes[(i, j)]``: the only node classes instance ``j`` of bridge ``i`` has; a
        node runs ``steps`` progress steps of ``step_time`` s."""
        args = ("--step-time", str(step_time), "--steps", str(steps))
        nodes = nodes or {}

        def only(i: int, j: int) -> list[str]:
            return [f"--node={n}" for n in nodes.get((i, j), ())]

        with ThreadPoolExecutor() as pool:  # start-up is CPU-bound imports: overlap them
            urls = [
                [
                    pool.submit(self.cluster.emulator, "comfyui", *args, *only(i, j))
                    for j in range(n)
                ]
                for i, n in enumerate(instances)
            ]
            comfy = [[f.result() for f in row] for row in urls]
        self.basic = frozenset(comfy[i][j] for i, j in nodes)
        self.bridges = [Bridge(p, c) for p, c in zip(server_ports, comfy, strict=True)]
        for b in self.bridges:
            self.start_bridge(b)

    def start_bridge(self, b: Bridge) -> None:
        b.proc, b.port = self.cluster.bridge(
            b.server_port, b.comfyui, *BRIDGE_ARGS, port=b.port or None, **BRIDGE_ENV
        )
        if not b.bridge_id:
            b.bridge_id = httpx.get(f"http://127.0.0.1:{b.port}/api/status").json()["bridgeId"]

    async def kill_one(self, rng: random.Random, b: Bridge | None = None) -> Bridge:
        """SIGKILL a bridge (``b``, else one at random); start it again a moment later.
        Returns the bridge."""
        b = b or rng.choice(self.bridges)
        assert b.proc is not None
        b.proc.kill()
        await asyncio.sleep(rng.uniform(0.5, 3.0))
        await asyncio.to_thread(self.start_bridge, b)
        return b

    async def restart_one(self, rng: random.Random) -> Bridge:
        """Stop a bridge as an operator does (SIGTERM: it closes its socket and spools what
        runs) and start it again at once: a routine restart. Returns the bridge."""
        b = rng.choice(self.bridges)
        assert b.proc is not None
        await asyncio.to_thread(b.proc.stop)
        await asyncio.to_thread(self.start_bridge, b)
        return b

    def instances(self, server_port: int | None = None) -> list[str]:
        """The ComfyUI instances (URLs) behind every bridge, or behind those of one serve."""
        return [
            url for b in self.bridges if server_port in (None, b.server_port) for url in b.comfyui
        ]

    async def registered(self, server_port: int | None = None, within: float = 30.0) -> None:
        """Once every bridge (or those of one serve) is registered with the serve holding
        its socket, as that serve's snapshot says; gives up after ``within`` s."""
        bridges = [b for b in self.bridges if server_port in (None, b.server_port)]
        ports = sorted({b.server_port for b in bridges})
        deadline = time.monotonic() + within
        async with httpx.AsyncClient(timeout=2.0) as http:
            while time.monotonic() < deadline:
                rows = await _hub_rows(http, ports)
                if all(b.bridge_id in rows for b in bridges):
                    return
                await asyncio.sleep(0.05)

    async def busy_spans(self) -> dict[str, list[tuple[float, float]]]:
        """Per instance, when it ran prompts (the emulator's record; a prompt still running
        counts up to now)."""
        spans: dict[str, list[tuple[float, float]]] = {}
        async with httpx.AsyncClient(timeout=10.0) as http:
            for url in self.instances():
                stats = (await http.get(f"{url}/emulator/stats", params={"spans": "true"})).json()
                spans[url] = [(s, e) for s, e in stats["busySpans"]]
                if stats["runningSince"] is not None:
                    spans[url].append((stats["runningSince"], time.time()))
        return spans

    async def slots_taken(self) -> dict[str, int]:
        """Per bridge, the slots not free as the hub holding its socket sees them, and the
        tasks the bridge itself still runs or holds; a bridge no hub has is all taken."""
        async with httpx.AsyncClient(timeout=5.0) as http:
            hub = await _hub_rows(http, sorted({b.server_port for b in self.bridges}))
            taken = {}
            for b in self.bridges:
                row = hub.get(b.bridge_id)
                own = await _own_status(http, b.port)
                if row is None or own is None:
                    taken[b.bridge_id] = len(b.comfyui)
                    continue
                held = len(row["running"]) + len(row["pending"])
                taken[b.bridge_id] = max(row["instances"] - row["free"], held) + len(own["tasks"])
            return taken


async def _hub_rows(http: httpx.AsyncClient, ports: list[int]) -> dict[str, dict[str, Any]]:
    """The bridges each serve holds a socket of (``local``), by bridge id."""
    rows: dict[str, dict[str, Any]] = {}
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for port in ports:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = await http.get(f"http://127.0.0.1:{port}/api/admin/snapshot", headers=auth)
            for row in r.json()["bridges"]:
                if row.get("local") and row.get("online"):
                    rows[row["bridgeId"]] = row
    return rows


async def _own_status(http: httpx.AsyncClient, port: int) -> dict[str, Any] | None:
    """The bridge's own view, when it is up and connected with nothing left to send."""
    try:
        status: dict[str, Any] = (await http.get(f"http://127.0.0.1:{port}/api/status")).json()
    except (httpx.HTTPError, ValueError):
        return None
    if status["connection"]["state"] != "connected" or status["spooled"]:
        return None
    return status
