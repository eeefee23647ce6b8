"""aigcq against running ComfyUI instances (real ones, or ``aigcq emulate comfyui``): two
``aigcq serve`` on a private Redis, one ``aigcq bridge`` per instance (spread over both
serves), and a client; prints one JSON object of what each check found.

    python -m bench.real_comfyui --comfyui http://127.0.0.1:8188 --comfyui http://127.0.0.1:8189 \\
        [--kill-cmd 'kill -9 $(cat /tmp/comfy{port}/pid)' --start-cmd '...{port}...']

Checks: ``plain`` (tasks succeed, their files are PNGs), ``cancel`` (a running prompt is
stopped on its instance and the task waiting behind it runs there: seconds from the cancel
to the prompt gone, and to the next one started by ComfyUI's own ``execution_start``),
``invalid`` (a node class no instance has fails ``UnknownNodeClass``; a value ComfyUI
refuses fails ``PromptValidation``; a node raising fails ``NodeError``: each once, not
retried), ``bridge_restart`` (a bridge SIGKILLed mid-prompt and started again re-adopts
it: one result, one prompt in ComfyUI), ``capacity`` (each serve's queue view counts every
bridge), ``eta`` (a burst of 20 short tasks: the median error of every ``etaStartMs``
told against the task's start, as a share of the wait left) and, with ``--kill-cmd``,
``kill`` (an instance killed mid-prompt: seconds until
the task runs on another). Long prompts chain ``ImageBlur`` on a 512 px image where the
instance has it (real ComfyUI, about 0.2 s a node on a CPU), else ``ImageInvert`` (the
emulator, ``--step-time`` a step). Loopback only; everything it started is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import websockets
from bench import smoke
from bench.processes import ADMIN_TOKEN, CLIENT_TOKEN, Cluster, Proc

from aigcq.embedded.redis import EmbeddedRedis

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
AUTH = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
Where = tuple[str, str, str]  # instance URL, prompt id, queue_running | queue_pending
#: each run's task ids (prompt ids) are new: ComfyUI keeps the history of earlier runs
RUN = f"r{int(time.time()) % 1_000_000}"


def generate(task_id: str, **payload: Any) -> dict[str, Any]:
    return {
        "type": "generate",
        "taskId": task_id,
        "platform": "comfyui",
        "AIGC": "proj",
        "payload": payload,
    }


class Client:
    """A business backend on one serve's client WebSocket, keeping results per taskId."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.results: dict[str, list[dict[str, Any]]] = {}
        #: each ETA told per taskId: (when it was read, etaStartMs / 1000)
        self.etas: dict[str, list[tuple[float, float]]] = {}

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps(message).decode())

    async def next(self, timeout: float) -> None:
        msg = orjson.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        if msg["type"] == "result":
            self.results.setdefault(msg["taskId"], []).append(msg)
        elif msg["type"] in ("submitted", "QUEUE_UPDATE") and msg.get("etaStartMs"):
            told = (time.time(), msg["etaStartMs"] / 1000)
            self.etas.setdefault(msg["taskId"], []).append(told)

    async def linger(self, seconds: float) -> None:
        """Keep reading for a while, to catch a duplicate."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await self.next(left)


class Run:
    """The cluster under test, the instances and how a long prompt is made on them."""

    def __init__(self, cluster: Cluster, comfy: list[str], serves: list[int]) -> None:
        self.cluster, self.comfy, self.serves = cluster, comfy, serves
        self.bridges: list[tuple[Proc, int]] = []
        self.slow_node = "ImageInvert"
        self.http = httpx.AsyncClient(timeout=10.0)

    def graph(self, tag: str, chain: int = 0) -> dict[str, Any]:
        """EmptyImage → ``chain`` slow nodes (or one ImageInvert) → SaveImage; the colour
        differs per tag, so ComfyUI's cache never answers for another task."""
        color = zlib.crc32(tag.encode()) & 0xFFFFFF
        size = 512 if self.slow_node == "ImageBlur" else 64
        inputs = {"width": size, "height": size, "batch_size": 1, "color": color}
        g: dict[str, Any] = {"1": {"class_type": "EmptyImage", "inputs": inputs}}
        prev = "1"
        for i in range(max(chain, 1)):
            node = self.slow_node if chain else "ImageInvert"
            args: dict[str, Any] = {"image": [prev, 0]}
            if node == "ImageBlur":
                args |= {"blur_radius": 15, "sigma": 3.0}
            prev = str(10 + i)
            g[prev] = {"class_type": node, "inputs": args}
        save = {"images": [prev, 0], "filename_prefix": tag}
        g["9"] = {"class_type": "SaveImage", "inputs": save}
        return g

    def task(self, task_id: str, chain: int = 0) -> dict[str, Any]:
        return generate(task_id, workflowId=f"rc-{task_id}", workflow=self.graph(task_id, chain))

    async def where(self, task_id: str) -> Where | None:
        """The instance whose ``/queue`` holds a prompt of ``task_id`` (any attempt)."""
        for url in self.comfy:
            try:
                q = (await self.http.get(f"{url}/queue", timeout=2.0)).json()
            except httpx.HTTPError:
                continue
            for kind in ("queue_running", "queue_pending"):
                for item in q[kind]:
                    if item[1] == task_id or str(item[1]).startswith(f"{task_id}-"):
                        return url, str(item[1]), kind
        return None

    async def started_at(self, task_id: str) -> float | None:
        """When ComfyUI started ``task_id``'s prompt (its history's execution_start)."""
        for url in self.comfy:
            entry = (await self.http.get(f"{url}/history/{task_id}")).json().get(task_id) or {}
            for name, data in entry.get("status", {}).get("messages", []):
                if name == "execution_start":
                    return float(data["timestamp"]) / 1000
        return None

    async def running_at(self, task_id: str) -> float | None:
        """When aigcq saw ``task_id`` start running (its bridge's acknowledgement of the
        prompt queued on a free instance: its timeline's first ``running``)."""
        url = f"http://127.0.0.1:{self.serves[0]}/api/tasks/{task_id}"
        timeline = (await self.http.get(url, headers=AUTH)).json().get("timeline") or []
        return next((float(e["t"]) for e in timeline if e.get("state") == "running"), None)

    async def client(self, name: str, serve: int = 0) -> Client:
        query = f"token={CLIENT_TOKEN}&id={name}"
        ws = await websockets.connect(f"ws://127.0.0.1:{self.serves[serve]}/?{query}")
        return Client(ws)


async def until(probe: Callable[[], Awaitable[Any]], within: float, step: float = 0.02) -> Any:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if found := await probe():
            return found
        await asyncio.sleep(step)
    return None


async def read(client: Client, task_ids: set[str], within: float) -> None:
    """Until each of ``task_ids`` has a result (or ``within`` passed)."""
    end = time.monotonic() + within
    while not task_ids <= set(client.results) and time.monotonic() < end:
        with contextlib.suppress(TimeoutError):
            await client.next(timeout=0.5)


def statuses(client: Client, task_id: str) -> list[str]:
    return [m["status"] for m in client.results.get(task_id, [])]


async def plain(run: Run) -> dict[str, Any]:
    client = await run.client("rc-plain")
    ids = [f"{RUN}-plain-{i}" for i in range(4)]
    started = time.monotonic()
    for task_id in ids:
        await client.send(run.task(task_id))
    await read(client, set(ids), 60)
    pngs = 0
    for task_id in ids:
        for f in client.results.get(task_id, [{}])[0].get("result", {}).get("data", []):
            pngs += (await run.http.get(f["fileUrl"])).content[:4] == b"\x89PNG"
    return {
        "seconds": round(time.monotonic() - started, 2),
        "results": {t: statuses(client, t) for t in ids},
        "png_files": pngs,
    }


async def eta(run: Run, burst: int = 20) -> dict[str, Any]:
    """A burst of short tasks on a fleet whose run times are known (one warm-up task ran):
    every ``etaStartMs`` told (the submit reply and each QUEUE_UPDATE) against when the
    task started running (its bridge queued it on a free instance); the error is a share
    of the wait that was left."""
    client = await run.client("rc-eta")
    warm = f"{RUN}-eta-warm"
    await client.send(run.task(warm))
    await read(client, {warm}, 60)
    await asyncio.sleep(1.5)  # an estimate refresh sees the recorded run
    ids = [f"{RUN}-eta-{i}" for i in range(burst)]
    started = time.monotonic()
    for task_id in ids:
        await client.send(run.task(task_id))
    await read(client, set(ids), 120)
    errors, untold = [], 0
    for task_id in ids:
        start = await run.running_at(task_id)
        told = [(at, eta) for at, eta in client.etas.get(task_id, []) if start and at < start]
        untold += not told
        errors += [abs(eta - start) / max(start - at, 1.0) for at, eta in told if start]
    errors.sort()
    return {
        "burst": burst,
        "seconds": round(time.monotonic() - started, 2),
        "estimates": len(errors),
        "tasks_told_no_eta": untold,
        "median_error_share": round(errors[len(errors) // 2], 3) if errors else None,
        "p90_error_share": round(errors[int(len(errors) * 0.9)], 3) if errors else None,
    }


async def cancel(run: Run, how: str) -> dict[str, Any]:
    """Two long prompts, one per instance, a task waiting behind them; one is cancelled."""
    client = await run.client(f"rc-cancel-{how}")
    slow = [f"{RUN}-cancel-{how}-{i}" for i in range(2)]
    for task_id in slow:
        await client.send(run.task(task_id, chain=12))

    async def both() -> list[Where] | None:
        found = [w for t in slow if (w := await run.where(t)) and w[2] == "queue_running"]
        return found if len(found) == len(slow) else None

    at = await until(both, 30)
    if at is None:
        return {"error": "the two long prompts did not both run"}
    following = f"{RUN}-cancel-{how}-next"
    await client.send(run.task(following))
    await asyncio.sleep(1.0)
    victim, wall, t = slow[0], time.time(), time.monotonic()
    if how == "client":
        await client.send({"type": "cancel", "taskId": victim})
    else:
        url = f"http://127.0.0.1:{run.serves[1]}/api/tasks/{victim}/cancel"
        await run.http.post(url, headers=AUTH)

    async def gone() -> bool:
        w = await run.where(victim)
        return w is None or w[2] != "queue_running"

    await until(gone, 30)
    gone_s = time.monotonic() - t
    await read(client, {victim, following, slow[1]}, 60)
    next_start = await run.started_at(following)
    return {
        "cancel_to_prompt_gone_s": round(gone_s, 2),
        "cancel_to_next_started_s": round(next_start - wall, 2) if next_start else None,
        "victim": statuses(client, victim),
        "next": statuses(client, following),
    }


async def invalid(run: Run) -> dict[str, Any]:
    client = await run.client("rc-invalid")
    unknown = run.graph(f"{RUN}-u")
    unknown["10"]["class_type"] = "NoSuchNode"
    too_big = run.graph(f"{RUN}-v")
    too_big["1"]["inputs"]["width"] = 10**9
    raising = run.graph(f"{RUN}-w")
    raising["9"]["inputs"]["filename_prefix"] = "../../../outside"
    cases = {"unknown_class": unknown, "value_refused": too_big, "node_raises": raising}
    for name, g in cases.items():
        await client.send(generate(f"{RUN}-{name}", workflowId=f"rc-{name}", workflow=g))
    await read(client, {f"{RUN}-{name}" for name in cases}, 30)
    found = {}
    for name in cases:
        task_id = f"{RUN}-{name}"
        url = f"http://127.0.0.1:{run.serves[0]}/api/tasks/{task_id}"
        task = (await run.http.get(url, headers=AUTH)).json()
        first = client.results.get(task_id, [{}])[0]
        found[name] = {
            "results": statuses(client, task_id),
            "code": first.get("error", {}).get("code"),
            "attempts": task.get("attempt"),
        }
    return found


async def long_task(run: Run, name: str, chain: int) -> tuple[Client, str, Where | None]:
    """A client, and a task of ``chain`` slow nodes it sent: where its prompt runs (None:
    it did not start within 30 s)."""
    client = await run.client(f"rc-{name}")
    task_id = f"{RUN}-{name}"
    await client.send(run.task(task_id, chain=chain))
    return client, task_id, await until(lambda: run.where(task_id), 30)


async def bridge_restart(run: Run) -> dict[str, Any]:
    client, task_id, at = await long_task(run, "restart", 14)
    if at is None:
        return {"error": "the prompt did not start"}
    i = run.comfy.index(at[0])
    proc, port = run.bridges[i]
    await asyncio.sleep(0.8)
    proc.kill()
    await asyncio.sleep(0.5)
    t = time.monotonic()
    proc.start()
    await read(client, {task_id}, 60)
    restart_s = time.monotonic() - t
    await client.linger(2.0)
    prompts = 0
    for url in run.comfy:
        history = (await run.http.get(f"{url}/history")).json()
        prompts += sum(1 for p in history if p == task_id or p.startswith(f"{task_id}-"))
    return {
        "restart_to_result_s": round(restart_s, 2),
        "results": statuses(client, task_id),
        "prompts_in_comfyui": prompts,
        "bridge_port": port,
    }


async def kill(run: Run, kill_cmd: str, start_cmd: str) -> dict[str, Any]:
    client, task_id, at = await long_task(run, "kill", 16)
    if at is None:
        return {"error": "the prompt did not start"}
    await asyncio.sleep(1.0)
    port = urlsplit(at[0]).port
    t = time.monotonic()
    subprocess.run(kill_cmd.format(port=port), shell=True, check=False)

    async def elsewhere() -> Where | None:
        w = await run.where(task_id)
        return w if w and w[0] != at[0] and w[2] == "queue_running" else None

    moved = await until(elsewhere, 60)
    moved_s = time.monotonic() - t
    await read(client, {task_id}, 90)
    if start_cmd:
        subprocess.Popen(start_cmd.format(port=port), shell=True, start_new_session=True)
    return {
        "kill_to_running_elsewhere_s": round(moved_s, 2) if moved else None,
        "results": statuses(client, task_id),
    }


async def capacity(run: Run) -> dict[str, Any]:
    rows = {}
    for port in run.serves:
        url = f"http://127.0.0.1:{port}/api/admin/snapshot"
        snap = (await run.http.get(url, headers=ADMIN)).json()
        rows[port] = {"capacity": snap["queues"][0]["capacity"], "bridges": len(snap["bridges"])}
    return {"instances": len(run.comfy), "per_serve": rows}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="aigcq-real-comfyui-"))
    redis = EmbeddedRedis(tmp / "redis")
    cluster = Cluster(tmp, redis.start())
    run: Run | None = None
    try:
        cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 0}}})
        env = {"AIGCQ_RUNNINGHUB_URL": "http://127.0.0.1:9", "AIGCQ_HEALTH_INTERVAL_S": "0.5"}
        serves = [cluster.server(None, **env)[1] for _ in range(2)]
        if args.smoke:
            args.comfyui = [cluster.emulator("comfyui") for _ in range(2)]
        run = Run(cluster, args.comfyui, serves)
        info = (await run.http.get(f"{args.comfyui[0]}/object_info")).json()
        run.slow_node = "ImageBlur" if "ImageBlur" in info else "ImageInvert"
        stats = (await run.http.get(f"{args.comfyui[0]}/system_stats")).json()
        for i, url in enumerate(args.comfyui):
            run.bridges.append(cluster.bridge(serves[i % 2], [url], "--heartbeat=1"))
        await asyncio.sleep(2.0)  # every process has read the others' bridges
        found: dict[str, Any] = {
            "comfyui_version": stats.get("system", {}).get("comfyui_version"),
            "slow_node": run.slow_node,
            "plain": await plain(run),
            "eta": await eta(run),
            "cancel_client": await cancel(run, "client"),
            "cancel_http": await cancel(run, "http"),
            "invalid": await invalid(run),
            "bridge_restart": await bridge_restart(run),
            "capacity": await capacity(run),
        }
        if args.kill_cmd:
            found["kill"] = await kill(run, args.kill_cmd, args.start_cmd)
        return found
    finally:
        if run is not None:
            await run.http.aclose()
        cluster.close()
        redis.stop()


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", action="append", default=[], help="an instance; repeat")
    p.add_argument("--kill-cmd", default="", help="kills the instance on {port} (shell)")
    p.add_argument("--start-cmd", default="", help="starts it again (shell, in the background)")
    args = smoke.parse_args(p, {}, argv)  # --smoke: against two ComfyUI emulators of its own
    if len(args.comfyui) < 2 and not args.smoke:
        p.error("give at least two --comfyui instances")
    return args


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse(sys.argv[1:]))), indent=1))
