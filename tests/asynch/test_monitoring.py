"""Monitoring end to end: every metric the Grafana board (``deploy/grafana/aigcq.json``)
queries is in a ``/metrics`` output (serve with a bridge and a finished task, and
model-asynch), and a real Prometheus (Debian's ``prometheus``; skipped without it) scrapes
both with the metrics token, refuses to scrape without it, and evaluates every panel's
query. Here, beside the asynch tests, for their PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from aigcq.client import AsyncClient
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from tests.fakes.asynch import Asynch
from tests.fakes.bridge import BRIDGE_TOKEN, Bridge
from tests.fakes.processes import reserved_port
from tests.fakes.service import service_with_runninghub
from tests.fakes.waiting import WaitTimeout, wait_until

BOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "aigcq.json"
TOKEN, SCRAPE = "monitoring-client-token", "monitoring-scrape-token"
AIGC = "monitoring-proj"  # metrics are process-wide: a project no other test uses
PAYLOAD = {"workflowId": "1904136902449209346", "nodeInfoList": []}


@dataclass
class Targets:
    serve: str  # host:port
    asynch: str


def board_queries() -> list[str]:
    board = json.loads(BOARD.read_text())
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


@pytest.fixture
async def targets(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, asynch: Asynch
) -> AsyncIterator[Targets]:
    """Serve (a task finished on RunningHub, then a bridge with two instances) and asynch
    (a model created), both scraped with the metrics token."""
    models = f'{{"{AIGC}": {{"comfyui": {{"apikey": "k", "concurrency": 1}}}}}}'
    emulator = RunningHubEmulatorConfig(duration_s=0.1)
    async with service_with_runninghub(
        tmp_path, redis, redis_url, models=models, emulator=emulator, token=TOKEN,
        bridge_token=BRIDGE_TOKEN, metrics_token=SCRAPE,
    ) as env:  # fmt: skip
        async with AsyncClient(env.ws_url, TOKEN, "mon") as client:
            task_id = await client.submit("comfyui", PAYLOAD, aigc=AIGC)
            assert (await client.result(task_id, timeout=30)).ok
        bridge = await Bridge.connect(env.port)
        await bridge.register(count=2)
        await asynch.create_model("monitored", "http://127.0.0.1:9")
        try:
            yield Targets(env.base.removeprefix("http://"), asynch.url.removeprefix("http://"))
        finally:
            await bridge.ws.close()


async def exported(*hosts: str, token: str = SCRAPE) -> set[str]:
    """Every metric name in the ``/metrics`` of ``hosts``: families and samples."""
    names: set[str] = set()
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
        for host in hosts:
            reply = await http.get(f"http://{host}/metrics")
            assert reply.status_code == 200, (host, reply.text)
            for family in text_string_to_metric_families(reply.text):
                names |= {family.name, f"{family.name}_total"}
                names |= {sample.name for sample in family.samples}
    return names


async def test_every_metric_the_board_queries_is_exported(targets: Targets) -> None:
    queried = {name for expr in board_queries() for name in re.findall(r"aigcq_\w+", expr)}
    assert {"aigcq_tasks_delayed", "aigcq_end_to_end_latency_seconds_bucket"} <= queried
    assert sorted(queried - await exported(targets.serve, targets.asynch)) == []


def p99_panel() -> dict[str, Any]:
    board = json.loads(BOARD.read_text())
    return next(p for p in board["panels"] if "p99" in p["title"] and "result" in p["title"])


def test_the_board_charts_a_p99_and_the_tasks_backing_off() -> None:
    assert any("histogram_quantile(0.99" in t["expr"] for t in p99_panel()["targets"])
    assert any("aigcq_tasks_delayed" in expr for expr in board_queries())


# ---- a real Prometheus ------------------------------------------------------------------


def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary (Debian's `prometheus`)")
    return binary


def scrape_config(t: Targets) -> str:
    jobs = [
        ("serve", t.serve, SCRAPE), ("asynch", t.asynch, SCRAPE), ("no-token", t.serve, ""),
    ]  # fmt: skip
    # a loaded host may take over a second to answer one scrape: 2 s, and the test waits
    # for the scrapes to settle rather than judging the first
    lines = ["global: {scrape_interval: 2s, scrape_timeout: 2s}", "scrape_configs:"]
    for job, host, token in jobs:
        lines.append(f"  - job_name: {job}")
        if token:
            lines.append(f"    authorization: {{credentials: {token}}}")
        lines.append(f'    static_configs: [{{targets: ["{host}"]}}]')
    return "\n".join(lines) + "\n"


@pytest.fixture
async def prometheus(targets: Targets, tmp_path: Path) -> AsyncIterator[str]:
    binary = prometheus_binary()
    config = tmp_path / "prometheus.yml"
    config.write_text(scrape_config(targets))
    listen = f"127.0.0.1:{reserved_port()}"
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address={listen}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield f"http://{listen}"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def api(http: httpx.AsyncClient, path: str, **params: str) -> Any:
    reply = await http.get(path, params=params)
    reply.raise_for_status()  # 503 while Prometheus starts
    body = reply.json()
    assert body["status"] == "success", (path, params, body)
    return body["data"]


async def test_a_real_prometheus_scrapes_with_the_token(prometheus: str, targets: Targets) -> None:
    async with httpx.AsyncClient(base_url=prometheus, timeout=10) as http:

        async def health() -> dict[str, str] | None:
            try:
                found = await api(http, "/api/v1/targets")
            except httpx.HTTPError:
                return None  # not listening, or not ready, yet
            seen = {t["labels"]["job"]: t["health"] for t in found["activeTargets"]}
            last[:] = [seen]
            return seen if seen == expected else None

        expected = {"serve": "up", "asynch": "up", "no-token": "down"}
        last: list[dict[str, str]] = []
        try:
            await wait_until(health, 60, 0.5, what="Prometheus' scrapes: with the token up")
        except WaitTimeout:
            pytest.fail(f"scrapes never settled as expected: {last}")
        labels = f'job="serve", aigc="{AIGC}", outcome="success"'
        query = f"aigcq_end_to_end_latency_seconds_count{{{labels}}}"
        [sample] = (await api(http, "/api/v1/query", query=query))["result"]
        assert float(sample["value"][1]) >= 1  # process-wide: earlier tests count too
        await asyncio.sleep(2.5)  # a few scrapes: the rates have two points
        for expr in board_queries():  # every panel's query parses and evaluates
            concrete = expr.replace("$aigc", ".*").replace("$__rate_interval", "1m")
            await api(http, "/api/v1/query", query=concrete)
