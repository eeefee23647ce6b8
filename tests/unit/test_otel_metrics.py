"""Issue 41 §1: the metrics of ``/metrics`` through OpenTelemetry: the switch (``OTEL_*``),
the Prometheus → OTel mapping, the export at a process's end (to a real OTLP receiver,
tests/fakes/otlp.py), and nothing of OpenTelemetry loaded when off."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import AggregationTemporality, Gauge, Histogram, Sum
from opentelemetry.sdk.resources import Resource
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Info
from prometheus_client import Gauge as PromGauge
from prometheus_client import Histogram as PromHistogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from aigcq.observability import metrics, otel_metrics, tracing
from tests.fakes.otlp import Buckets, OtlpReceiver, decode_metrics


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),  # the default: off
        ({"OTEL_METRICS_EXPORTER": "otlp"}, True),
        ({"OTEL_METRICS_EXPORTER": "none"}, False),
        ({"OTEL_METRICS_EXPORTER": "prometheus"}, False),  # that one is /metrics
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:4318/v1/metrics"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, False),
        ({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, False),
    ],
)
def test_metrics_are_exported_only_when_otel_variables_ask(env: dict[str, str], on: bool) -> None:
    assert otel_metrics.wanted(env) is on


def test_the_interval_is_otel_metric_export_interval_in_ms() -> None:
    assert otel_metrics.interval_s({}) == 60.0
    assert otel_metrics.interval_s({"OTEL_METRIC_EXPORT_INTERVAL": "200"}) == 0.2
    assert otel_metrics.interval_s({"OTEL_METRIC_EXPORT_INTERVAL": "soon"}) == 60.0
    assert otel_metrics.interval_s({"OTEL_METRIC_EXPORT_INTERVAL": "0"}) == 60.0


def families() -> list[Metric]:
    """A counter, a gauge with labels, a histogram, an info and a counter never counted."""
    registry = CollectorRegistry()
    Counter("t_jobs_total", "Jobs done.", ["kind"], registry=registry).labels("a").inc(3)
    Counter("t_unused_total", "Never counted.", ["kind"], registry=registry)
    depth = PromGauge("t_depth", "Waiting.", ["queue"], registry=registry)
    depth.labels("q1").set(2)
    depth.labels("q2").set(0.5)
    latency = PromHistogram("t_latency_seconds", "Latency.", buckets=(1, 5), registry=registry)
    for seconds in (0.5, 3, 3, 10):
        latency.observe(seconds)
    Info("t_build", "Build.", registry=registry).info({"version": "1.2"})
    return list(registry.collect())


def test_prometheus_families_become_otel_sums_gauges_and_histograms() -> None:
    resource = Resource.create({"service.name": "unit"})
    data = otel_metrics.convert(families(), resource, now_ns=2_000, start_ns=1_000)
    [rm] = data.resource_metrics
    assert rm.resource.attributes["service.name"] == "unit"
    [sm] = rm.scope_metrics
    assert sm.scope.name == "aigcq"
    by_name = {m.name: m for m in sm.metrics}
    # named without _total; no _created; a family with no sample left out
    assert set(by_name) == {"t_jobs", "t_depth", "t_latency_seconds", "t_build_info"}

    jobs = by_name["t_jobs"].data
    assert isinstance(jobs, Sum) and jobs.is_monotonic
    assert jobs.aggregation_temporality is AggregationTemporality.CUMULATIVE
    [point] = jobs.data_points
    assert (point.attributes, point.value) == ({"kind": "a"}, 3.0)
    assert (point.start_time_unix_nano, point.time_unix_nano) == (1_000, 2_000)
    assert by_name["t_jobs"].description == "Jobs done."

    depth = by_name["t_depth"].data
    assert isinstance(depth, Gauge)
    assert {p.attributes["queue"]: p.value for p in depth.data_points} == {"q1": 2, "q2": 0.5}

    info = by_name["t_build_info"].data
    assert isinstance(info, Gauge)
    assert [(p.attributes, p.value) for p in info.data_points] == [({"version": "1.2"}, 1.0)]

    latency = by_name["t_latency_seconds"].data
    assert isinstance(latency, Histogram)
    assert latency.aggregation_temporality is AggregationTemporality.CUMULATIVE
    [h] = latency.data_points
    assert (h.count, h.sum, h.attributes) == (4, 16.5, {})
    assert list(h.explicit_bounds) == [1.0, 5.0]
    assert list(h.bucket_counts) == [1, 2, 1]  # ≤ 1, (1, 5], > 5
    assert h.start_time_unix_nano == 1_000

    # what a collector receives: the same, through the OTLP encoding
    [received] = decode_metrics(encode_metrics(data).SerializeToString())
    assert received.value("t_jobs", kind="a") == 3.0
    assert received.value("t_depth", queue="q2") == 0.5
    assert received.value("t_latency_seconds") == Buckets(4, 16.5, [1.0, 5.0], [1, 2, 1])
    assert received.metrics["t_jobs"].monotonic and received.metrics["t_jobs"].cumulative


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


def otel_env(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for name in os.environ:
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


async def state() -> list[Metric]:
    gauge = GaugeMetricFamily("unit_queue_depth", "Waiting.", labels=["aigc"])
    gauge.add_metric(["otel-unit"], 7)
    return [gauge]


async def test_at_its_end_a_process_exports_the_event_metrics_and_its_sources_state(
    monkeypatch: pytest.MonkeyPatch, receiver: OtlpReceiver
) -> None:
    """An interval longer than the test: the one export is the end's."""
    otel_env(
        monkeypatch,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_METRIC_EXPORT_INTERVAL="600000",
        OTEL_RESOURCE_ATTRIBUTES="service.instance.id=serve-2",
    )
    async with otel_metrics.exporting("unit-serve", [state]) as on:
        assert on
        metrics.callback_rejected("otel-unit")
        assert receiver.exports == []
    [export] = receiver.exports
    assert export.resource["service.name"] == "unit-serve"
    assert export.resource["service.instance.id"] == "serve-2"
    assert export.scopes == {"aigcq"}
    assert export.value("unit_queue_depth", aigc="otel-unit") == 7
    rejected = REGISTRY.get_sample_value("aigcq_callback_rejections_total", {"code": "otel-unit"})
    assert rejected and export.value("aigcq_callback_rejections", code="otel-unit") == rejected


def test_each_process_is_an_instance_of_its_own_with_an_sdk_that_names_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An SDK older than the one that makes a ``service.instance.id`` (only the ``otel``
    detector): the host and pid name the process."""
    from opentelemetry.sdk import resources

    otel_env(monkeypatch)
    monkeypatch.setattr(
        resources, "_build_resource_detectors", lambda: [resources.OTELResourceDetector()]
    )
    own = tracing.resource("aigcq").attributes
    assert own["service.instance.id"] == f"{socket.gethostname()}-{os.getpid()}"
    assert own["service.name"] == "aigcq"
    otel_env(monkeypatch, OTEL_RESOURCE_ATTRIBUTES="service.instance.id=serve-2")
    assert tracing.resource("aigcq").attributes["service.instance.id"] == "serve-2"


@pytest.mark.parametrize("off", [{"OTEL_METRICS_EXPORTER": "none"}, {"OTEL_SDK_DISABLED": "true"}])
async def test_off_nothing_is_exported(
    monkeypatch: pytest.MonkeyPatch, receiver: OtlpReceiver, off: dict[str, str]
) -> None:
    otel_env(monkeypatch, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, **off)
    async with otel_metrics.exporting("unit-serve", [state]) as on:
        assert not on
    assert receiver.exports == []  # on, the end's export would have come


def test_off_a_serve_process_s_metrics_path_loads_nothing_of_opentelemetry() -> None:
    """With no OTEL_* (the default), the metrics path of a serve process (its exporting
    on and off, a scrape) imports no module of OpenTelemetry: none beyond those its
    libraries load themselves (FastAPI and redis-py import parts of the API and SDK when
    installed), and no exporter."""
    code = (
        "import asyncio, sys\n"
        "import aigcq.serve.server\n"
        "from aigcq.observability import metrics, otel_metrics, tracing\n"
        "def loaded():\n"
        "    return {m for m in sys.modules if m.startswith('opentelemetry')}\n"
        "before = loaded()\n"
        "async def main():\n"
        "    async with otel_metrics.exporting('aigcq', []) as on:\n"
        "        assert not on\n"
        "        await metrics.exposition([])\n"
        "asyncio.run(main())\n"
        "print(sorted(loaded() - before))\n"
        "print(sorted(m for m in loaded() if m.startswith('opentelemetry.exporter')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["[]", "[]"], out.stdout
