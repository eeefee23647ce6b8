"""The metrics of ``/metrics`` through OpenTelemetry (OTLP/HTTP), when ``OTEL_*`` asks.

On in a serve process (the dispatcher's too) when ``OTEL_METRICS_EXPORTER=otlp``, or an
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is set and
``OTEL_METRICS_EXPORTER`` is not ``none``; ``OTEL_SDK_DISABLED=true`` turns it off. Every
``OTEL_METRIC_EXPORT_INTERVAL`` ms (60000) and once more at the process's end, the families
``/metrics`` shows (:func:`aigcq.observability.metrics.families`) are converted
(:func:`convert`) and sent by the SDK's ``OTLPMetricExporter``, which reads its endpoint,
headers and timeout from ``OTEL_*``; the Resource is the traces' (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``). ``/metrics`` stays as it is.

The SDK has no hook for metrics read elsewhere, so the Prometheus families are mapped
directly: a counter is a monotonic cumulative Sum named without ``_total``, a histogram an
explicit-bucket Histogram, anything else (gauge, info, stateset, ...) a Gauge per sample
name; labels are attributes, ``_created`` samples are left out.

Off (the default), nothing of OpenTelemetry is imported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric as Family
from prometheus_client.samples import Sample

from aigcq.observability import metrics, tracing

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import (
        HistogramDataPoint,
        Metric,
        MetricExporter,
        MetricsData,
        NumberDataPoint,
    )
    from opentelemetry.sdk.resources import Resource

log = logging.getLogger(__name__)

#: the export interval when ``OTEL_METRIC_EXPORT_INTERVAL`` sets none (the OTel spec's), ms
DEFAULT_INTERVAL_MS = 60_000
#: when the counters began (the start of their cumulative sums): imported as a serve starts
STARTED_NS = time.time_ns()
SCOPE = "aigcq"


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``env`` (the environment) asks for metrics through OTLP."""
    env = os.environ if env is None else env
    if tracing.sdk_disabled(env):
        return False
    exporters = {e.strip().lower() for e in env.get("OTEL_METRICS_EXPORTER", "").split(",")}
    exporters.discard("")
    if exporters:
        return "otlp" in exporters
    return bool(
        env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def interval_s(env: Mapping[str, str] | None = None) -> float:
    """Seconds between exports: ``OTEL_METRIC_EXPORT_INTERVAL`` (ms), else the default."""
    env = os.environ if env is None else env
    raw = env.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
    try:
        ms = float(raw) if raw else DEFAULT_INTERVAL_MS
    except ValueError:
        log.warning("OTEL_METRIC_EXPORT_INTERVAL=%r is not a number of ms; 60000 it is", raw)
        ms = DEFAULT_INTERVAL_MS
    return (ms if ms > 0 else DEFAULT_INTERVAL_MS) / 1000


@contextlib.asynccontextmanager
async def exporting(service: str, sources: Sequence[metrics.Source]) -> AsyncIterator[bool]:
    """Around a serve process's life: the event metrics and ``sources``' state exported
    every interval and once more at the end, when the environment asks (yields whether it
    does); ``service``: the service name unless ``OTEL_SERVICE_NAME`` names one."""
    export = _setup(service, sources) if wanted() else None
    if export is None:
        yield False
        return
    seconds = interval_s()
    task = asyncio.create_task(export.run(seconds))
    log.info("OpenTelemetry metrics on (every %g s)", seconds)
    try:
        yield True
    finally:
        export.stop.set()
        await task
        with contextlib.suppress(Exception):
            await asyncio.to_thread(export.exporter.shutdown)


def _setup(service: str, sources: Sequence[metrics.Source]) -> Export | None:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError as exc:
        log.warning("OTEL_* asks for metrics, but the otel extra is not installed (%s)", exc)
        return None
    try:
        return Export(OTLPMetricExporter(), tracing.resource(service), sources)
    except Exception as exc:  # e.g. an OTEL_* value the SDK refuses: the serve goes on
        log.warning("OpenTelemetry metrics off: %r", exc)
        return None


@dataclass
class Export:
    """Sends ``/metrics``' families through ``exporter`` until :attr:`stop` is set."""

    exporter: MetricExporter
    resource: Resource
    sources: Sequence[metrics.Source]
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, seconds: float) -> None:
        """Export every ``seconds``, and once more when stopped."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), seconds)
            stopping = self.stop.is_set()  # read before: what counted until now is sent
            await self.once()
            if stopping:
                return

    async def once(self) -> None:
        """One export; a failure is logged, never raised."""
        from opentelemetry.sdk.metrics.export import MetricExportResult

        try:
            data = convert(await metrics.families(self.sources), self.resource, time.time_ns())
            result = await asyncio.to_thread(self.exporter.export, data)
        except Exception as exc:
            log.warning("OpenTelemetry metrics not exported: %r", exc)
            return
        if result is not MetricExportResult.SUCCESS:
            log.warning("OpenTelemetry metrics not exported (the exporter failed)")


# ---- Prometheus families → OTel metrics -------------------------------------------------


def convert(
    families: Iterable[Family], resource: Resource, now_ns: int, start_ns: int = STARTED_NS
) -> MetricsData:
    """The OTel ``MetricsData`` of Prometheus ``families`` read at ``now_ns``; ``start_ns``:
    when the counters began. A family with no sample is left out."""
    from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    converted = [m for family in families for m in _metrics(family, now_ns, start_ns)]
    scope = ScopeMetrics(InstrumentationScope(SCOPE), converted, "")
    return MetricsData([ResourceMetrics(resource, [scope], "")])


def _metrics(family: Family, now_ns: int, start_ns: int) -> list[Metric]:
    samples = [s for s in family.samples if s.name != f"{family.name}_created"]
    if not samples:
        return []
    if family.type == "counter":
        return [_sum(family, samples, now_ns, start_ns)]
    if family.type == "histogram":
        return [_histogram(family, samples, now_ns, start_ns)]
    return _gauges(family, samples, now_ns)


def _sum(family: Family, samples: Sequence[Sample], now_ns: int, start_ns: int) -> Metric:
    from opentelemetry.sdk.metrics.export import AggregationTemporality, Metric, Sum

    points = [_point(s.labels, s.value, now_ns, start_ns) for s in samples]
    data = Sum(points, AggregationTemporality.CUMULATIVE, is_monotonic=True)
    return Metric(family.name, family.documentation, family.unit, data)


def _gauges(family: Family, samples: Sequence[Sample], now_ns: int) -> list[Metric]:
    """A Gauge for each sample name (a gauge's is the family's; an info's ends ``_info``)."""
    from opentelemetry.sdk.metrics.export import Gauge, Metric

    by_name: dict[str, list[NumberDataPoint]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(_point(s.labels, s.value, now_ns, 0))
    return [
        Metric(name, family.documentation, family.unit, Gauge(points))
        for name, points in by_name.items()
    ]


def _point(labels: Mapping[str, str], value: float, now_ns: int, start_ns: int) -> NumberDataPoint:
    from opentelemetry.sdk.metrics.export import NumberDataPoint

    return NumberDataPoint(dict(labels), start_ns, now_ns, value)


@dataclass
class _Series:
    """One histogram series (its labels but ``le``) as Prometheus exposes it."""

    labels: dict[str, str]
    cumulative: list[tuple[float, float]] = field(default_factory=list)  # (le, count ≤ le)
    count: float = 0.0
    sum: float = 0.0

    def point(self, now_ns: int, start_ns: int) -> HistogramDataPoint:
        """Explicit bounds (the finite ``le``) and each bucket's own count; no min or max
        (Prometheus keeps none: ±inf, as the SDK sends when it records none)."""
        from opentelemetry.sdk.metrics.export import HistogramDataPoint

        buckets = sorted(self.cumulative)
        bounds = [le for le, _ in buckets if le != math.inf]
        cumulative = [c for _, c in buckets]
        counts = [int(c - below) for below, c in pairwise([0.0, *cumulative])]
        return HistogramDataPoint(
            attributes=self.labels,
            start_time_unix_nano=start_ns,
            time_unix_nano=now_ns,
            count=int(self.count),
            sum=self.sum,
            bucket_counts=counts,
            explicit_bounds=bounds,
            min=math.inf,
            max=-math.inf,
        )


def _histogram(family: Family, samples: Sequence[Sample], now_ns: int, start_ns: int) -> Metric:
    from opentelemetry.sdk.metrics.export import AggregationTemporality, Histogram, Metric

    series: dict[tuple[tuple[str, str], ...], _Series] = {}
    for s in samples:
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        one = series.setdefault(tuple(sorted(labels.items())), _Series(labels))
        suffix = s.name.removeprefix(family.name)
        if suffix == "_bucket":
            one.cumulative.append((float(s.labels["le"]), s.value))
        elif suffix == "_count":
            one.count = s.value
        elif suffix == "_sum":
            one.sum = s.value
    points = [one.point(now_ns, start_ns) for one in series.values()]
    data = Histogram(points, AggregationTemporality.CUMULATIVE)
    return Metric(family.name, family.documentation, family.unit, data)
