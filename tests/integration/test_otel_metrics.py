"""Issue 41 §1: with ``OTEL_*`` set, a serve exports through OTLP the metrics its
``/metrics`` shows. In-process serve on a real Redis, exporting to a real OTLP/HTTP
receiver (tests/fakes/otlp.py) every 200 ms."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from aigcq.plumbing.auth import issue_client_token
from tests.fakes.client import generate
from tests.fakes.otlp import MetricsExport, OtlpReceiver
from tests.fakes.service import SECRET, admin_service
from tests.fakes.waiting import until

AIGC = "otel-metrics-proj"  # metrics are process-wide: a project no other test uses
MODELS = f'{{"{AIGC}": {{"comfyui": {{"apikey": "k", "concurrency": 0}}}}}}'
QUEUE = {"aigc": AIGC, "platform": "comfyui"}


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """A receiver the serve started after exports its metrics to (and no traces)."""
    r = OtlpReceiver().start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.url)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    yield r
    r.stop()


async def scrape(base: str) -> list[Metric]:
    async with httpx.AsyncClient() as http:
        resp = await http.get(f"{base}/metrics")
    assert resp.status_code == 200
    return list(text_string_to_metric_families(resp.text))


def value(families: list[Metric], sample: str, **labels: str) -> float | None:
    found = [s.value for f in families for s in f.samples if (s.name, s.labels) == (sample, labels)]
    return found[0] if found else None


def rejections(families: list[Metric]) -> list[Sample]:
    return [s for f in families for s in f.samples if s.name == "aigcq_callback_rejections_total"]


def shows(export: MetricsExport, families: list[Metric]) -> bool:
    """``export`` has each ``aigcq_*`` family of the scrape that has samples (but a
    counter's ``_created``), our queue's depth and every callback rejection count as the
    scrape has them."""
    names = {f.name for f in families if f.samples and f.name.startswith("aigcq_")}
    names = {n for n in names if not n.endswith("_created")}
    return (
        names <= set(export.metrics)
        and export.value("aigcq_queue_depth", **QUEUE)
        == value(families, "aigcq_queue_depth", **QUEUE)
        and all(
            export.value("aigcq_callback_rejections", **s.labels) == s.value
            for s in rejections(families)
        )
    )


async def test_a_serve_exports_what_its_metrics_endpoint_shows(
    receiver: OtlpReceiver, tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> None:
    auth = {"Authorization": f"Bearer {issue_client_token(SECRET, 'b1')}"}
    async with admin_service(tmp_path, redis, redis_url, MODELS) as env:
        async with httpx.AsyncClient(base_url=env.base) as http:
            task = generate("otel-1", aigc=AIGC)
            sent = await http.post(
                "/api/tasks", json={k: v for k, v in task.items() if k != "type"}, headers=auth
            )
            assert sent.status_code == 202, sent.text
            await http.post("/callback/all", json={})  # unsigned: rejected, and counted
        families = await until(
            lambda: scrape(env.base),
            lambda fs: value(fs, "aigcq_queue_depth", **QUEUE) == 1,  # no bridge: it waits
        )
        assert rejections(families)  # the callback's
        export = await receiver.metrics_until(lambda e: shows(e, families))
    assert export.resource["service.name"] == "aigcq"
    assert export.resource["service.instance.id"]  # each process its own series
    assert export.scopes == {"aigcq"}
    rejected = export.metrics["aigcq_callback_rejections"]
    assert (rejected.kind, rejected.monotonic, rejected.cumulative) == ("sum", True, True)
    assert export.metrics["aigcq_queue_depth"].kind == "gauge"
