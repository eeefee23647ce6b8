"""``/metrics`` during a run through an in-process aigcq and RunningHub emulator: the
counters add up to the tasks that ran, and the derived gauges return to zero."""

from __future__ import annotations

from pathlib import Path

import httpx
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from aigcq.client import AsyncClient
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from tests.fakes.service import service_with_runninghub
from tests.fakes.waiting import until

TOKEN = "metrics-client-token"
AIGC = "metrics-proj"  # metrics are process-wide: a project no other test uses
PAYLOAD = {"workflowId": "1904136902449209346", "nodeInfoList": []}
TASKS = 5

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(base: str) -> Samples:
    async with httpx.AsyncClient() as http:
        resp = await http.get(f"{base}/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


async def test_counters_add_up_to_the_tasks_that_ran(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    models = f'{{"{AIGC}": {{"comfyui": {{"apikey": "k", "concurrency": 2}}}}}}'
    async with service_with_runninghub(
        tmp_path,
        redis,
        redis_url,
        models=models,
        emulator=RunningHubEmulatorConfig(duration_s=0.2),
        token=TOKEN,
        overflow_price={"runninghub": 0.25},
    ) as env:
        base = env.base
        async with AsyncClient(env.ws_url, TOKEN, "m1") as client:
            ids = [
                await client.submit("comfyui", PAYLOAD, task_id=f"m{i}", aigc=AIGC)
                for i in range(TASKS)
            ]
            during = await scrape(base)
            results = [await client.result(task_id, timeout=15) for task_id in ids]
        assert all(r.ok for r in results)
        async with httpx.AsyncClient() as http:
            await http.post(f"{base}/callback/all", json={})  # unsigned: rejected
        after = await until(
            lambda: scrape(base),
            lambda s: total(s, "aigcq_tasks_in_flight", aigc=AIGC) == 0,
        )

    queue = {"aigc": AIGC, "platform": "comfyui"}
    # A scrape reads the Redis-derived gauges before the counters, so a task that finishes
    # in between shows both in flight and finished: every task counts once, a running one
    # at most twice (seen on a busy host, where a scrape outlasted two 0.2 s tasks).
    in_flight = total(during, "aigcq_tasks_in_flight", aigc=AIGC)
    counted = (
        total(during, "aigcq_queue_depth", **queue)
        + in_flight
        + total(during, "aigcq_tasks_finished_total", aigc=AIGC)
    )
    assert TASKS <= counted <= TASKS + in_flight
    assert total(during, "aigcq_external_capacity", **queue) == 2
    ran = {"aigc": AIGC, "platform": "comfyui", "target": "runninghub"}
    assert total(after, "aigcq_tasks_finished_total", outcome="success", **ran) == TASKS
    assert total(after, "aigcq_tasks_finished_total", aigc=AIGC) == TASKS
    assert total(after, "aigcq_overflow_tasks_total", **ran) == TASKS
    assert total(after, "aigcq_queue_depth", **queue) == 0
    assert total(after, "aigcq_queue_oldest_wait_seconds", **queue) == 0
    e2e = {**ran, "outcome": "success"}  # this project's alone: the histograms carry aigc
    assert total(after, "aigcq_end_to_end_latency_seconds_count", **e2e) == TASKS
    assert total(after, "aigcq_dispatch_latency_seconds_count", **ran) == TASKS
    assert total(after, "aigcq_overflow_cost_total", target="runninghub") >= TASKS * 0.25
    assert total(after, "aigcq_callback_rejections_total", code="SignatureError") >= 1


async def test_a_metrics_token_closes_metrics_to_everyone_else(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    models = f'{{"{AIGC}": {{"comfyui": {{"apikey": "k", "concurrency": 1}}}}}}'
    async with (
        service_with_runninghub(
            tmp_path, redis, redis_url, models=models, emulator=RunningHubEmulatorConfig(),
            token=TOKEN, metrics_token="scrape-token",
        ) as env,
        httpx.AsyncClient(base_url=env.base) as http,
    ):  # fmt: skip
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "scrape-token"}):
            refused = await http.get("/metrics", headers=headers)
            assert refused.status_code == 401, headers
            assert refused.headers["www-authenticate"].startswith("Bearer")
        scraped = await http.get("/metrics", headers={"Authorization": "Bearer scrape-token"})
        assert scraped.status_code == 200 and "aigcq_queue_depth" in scraped.text


async def test_asynch_metrics_take_the_same_token() -> None:
    from aigcq.asynch.app import create_app

    app = create_app(metrics_token="scrape-token")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://asynch") as http:
        assert (await http.get("/metrics")).status_code == 401
        ok = await http.get("/metrics", headers={"Authorization": "Bearer scrape-token"})
        assert ok.status_code == 200 and "aigcq_asynch_gate_total" in ok.text
