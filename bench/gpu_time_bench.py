"""GPU time, not only queue time: model loads with and without affinity routing. Prints JSON.

One in-process ``aigcq serve`` (private Redis), one ``aigcq bridge`` agent in front of 8
ComfyUI emulators that charge ``--load-s`` whenever an instance switches checkpoints; 4
workflows, each on its own checkpoint, submitted in random order at ``--rate`` tasks/s.
The same load runs twice: with the bridge's affinity (an instance whose loaded checkpoint
the task needs first) and with plain least-loaded instance choice. Reported per run: the
share of instance time spent loading models, the loads, and submit → result latency.

Target (issue 16): affinity spends under a third of least-loaded's time on loads, and no
task waits more than one task-length longer than under least-loaded.

    python bench/gpu_time_bench.py [--tasks 120] [--rate 8] [--load-s 0.5]
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
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from tests.fakes.agent import quick_bridge
from tests.fakes.client import Client, generate
from tests.fakes.comfyui import model_graph
from tests.fakes.servers import serve_app
from tests.fakes.waiting import until

from aigcq.agent.app import Bridge
from aigcq.config import PlatformConfig, Settings
from aigcq.embedded.redis import EmbeddedRedis
from aigcq.emulators.comfyui import ComfyUIConfig, ComfyUIEmulator, create_app
from aigcq.plumbing.auth import issue_client_token
from aigcq.plumbing.redis_client import redis_client
from aigcq.serve.server import ServeProcess

SECRET = "gpu-bench-secret-with-at-least-32-bytes"
TOKEN = "gpu-bench-bridge"
INSTANCES = 8
CHECKPOINTS = [f"model-{i}.safetensors" for i in range(4)]


async def _free(service: ServeProcess) -> int:
    return service.hub.free_slots() if service.hub else 0


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * q))], 3)


async def one_run(
    tmp: Path, redis_url: str, args: argparse.Namespace, affinity: bool, order: list[str]
) -> dict[str, Any]:
    redis = redis_client(redis_url)
    await redis.flushall()
    models = {"proj": {"comfyui": {"apikey": "k", "concurrency": 0}}}
    run_dir = tmp / ("affinity" if affinity else "least-loaded")
    run_dir.mkdir()
    (run_dir / "model.json").write_text(json.dumps(models))
    settings = Settings(
        redis_url=redis_url,
        token_secret=SECRET,
        config_dir=run_dir,
        bridge_token=TOKEN,
        sweep_interval_s=0.1,
    )
    service = ServeProcess(settings, PlatformConfig.load(run_dir), redis)
    async with contextlib.AsyncExitStack() as stack:
        base = await stack.enter_async_context(serve_app(service.app))
        settings.callback_url = base
        emulators: list[ComfyUIEmulator] = []
        urls = []
        for i in range(INSTANCES):
            config = ComfyUIConfig(
                output_dir=run_dir / f"comfy{i}" / "output",
                step_time=args.step_s,
                steps=1,
                checkpoints=tuple(CHECKPOINTS),
                model_load_time=args.load_s,
            )
            app = create_app(config)
            urls.append(await stack.enter_async_context(serve_app(app)))
            emulators.append(app.state.emulator)
        server = base.replace("http", "ws") + "/ws"
        bridge_settings = quick_bridge(server, TOKEN, urls, run_dir / "bridge", affinity=affinity)
        bridge_settings = bridge_settings.model_copy(update={"heartbeat": 5.0})
        await stack.enter_async_context(Bridge(bridge_settings))
        port = int(base.rsplit(":", 1)[1])
        client = await Client(port, "gpu", issue_client_token(SECRET, "gpu")).connect()
        stack.push_async_callback(client.close)
        await until(lambda: _free(service), lambda n: n >= INSTANCES, within=30)
        sent: dict[str, float] = {}
        done: dict[str, float] = {}
        started = time.perf_counter()

        async def results() -> None:
            while len(done) < len(order):
                msg = await client.next(timeout=120)
                if msg.get("type") == "result":
                    done[msg["taskId"]] = time.perf_counter()

        reader = asyncio.create_task(results())
        for i, ckpt in enumerate(order):
            task_id = f"g{i}"
            sent[task_id] = time.perf_counter()
            await client.send(generate(task_id, workflow=model_graph(ckpt)))
            await asyncio.sleep(max(0.0, started + (i + 1) / args.rate - time.perf_counter()))
        await reader
        loading = sum(e.config.gpu.loading_s for e in emulators)
        busy = sum(e.config.gpu.busy_s for e in emulators)
        latency = [done[t] - sent[t] for t in sent]
        return {
            "affinity": affinity,
            "tasks": len(order),
            "loads": sum(e.config.gpu.loads for e in emulators),
            "loading_s": round(loading, 2),
            "busy_s": round(busy, 2),
            "loading_share": round(loading / busy, 3) if busy else 0.0,
            "latency_p50_s": pct(latency, 0.5),
            "latency_p99_s": pct(latency, 0.99),
            "latency_max_s": round(max(latency), 3),
        }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="aigcq-gpu-bench-"))
    redis = EmbeddedRedis(tmp / "redis", persist=False)
    url = redis.start()
    rng = random.Random(args.seed)
    order = [rng.choice(CHECKPOINTS) for _ in range(args.tasks)]
    try:
        runs = [await one_run(tmp, url, args, affinity, order) for affinity in (True, False)]
    finally:
        redis.stop()
    with_affinity, least_loaded = runs
    task_length = args.step_s * 4 + args.load_s
    return {
        "instances": INSTANCES,
        "checkpoints": len(CHECKPOINTS),
        "model_load_s": args.load_s,
        "rate_per_s": args.rate,
        "runs": runs,
        "loading_ratio": round(
            with_affinity["loading_s"] / max(least_loaded["loading_s"], 1e-9), 3
        ),
        "max_latency_over_least_loaded_s": round(
            with_affinity["latency_max_s"] - least_loaded["latency_max_s"], 3
        ),
        "task_length_s": task_length,
    }


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"tasks": 6, "rate": 20.0, "load_s": 0.05, "step_s": 0.01}

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=120)
    parser.add_argument("--rate", type=float, default=8.0, help="tasks submitted per second")
    parser.add_argument("--load-s", type=float, default=0.5, help="seconds per model load")
    parser.add_argument("--step-s", type=float, default=0.1, help="seconds per executed node")
    parser.add_argument("--seed", type=int, default=16)
    print(
        orjson.dumps(
            asyncio.run(main(smoke.parse_args(parser, SMOKE))), option=orjson.OPT_INDENT_2
        ).decode()
    )
