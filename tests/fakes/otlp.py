"""A real OTLP/HTTP receiver: what a collector decodes, kept for the tests to read.

``OtlpReceiver().start()`` listens on 127.0.0.1 (a free port) for ``POST /v1/traces`` and
``POST /v1/metrics`` (``application/x-protobuf``, gzip or not), decodes each
``ExportTraceServiceRequest`` / ``ExportMetricsServiceRequest`` with ``opentelemetry-proto``
and keeps its spans (:class:`Span`) or its metrics (:class:`MetricsExport`), answering as
a collector does. :meth:`OtlpReceiver.tree` prints a trace as a viewer draws it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status


@dataclass
class Span:
    name: str
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: str  # internal, server, client, producer, consumer
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    error: str | None = None  # the status description of an ERROR span
    resource: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which) if which else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def decode(body: bytes) -> list[Span]:
    """The spans of one ``ExportTraceServiceRequest``."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[Span] = []
    for rs in request.resource_spans:
        resource = _attrs(rs.resource.attributes)
        service = str(resource.get("service.name", ""))
        for ss in rs.scope_spans:
            for s in ss.spans:
                kind = PbSpan.SpanKind.Name(s.kind).removeprefix("SPAN_KIND_").lower()
                error = s.status.message if s.status.code == Status.STATUS_CODE_ERROR else None
                spans.append(
                    Span(
                        name=s.name,
                        service=service,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        kind=kind,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes=_attrs(s.attributes),
                        events=[(e.name, _attrs(e.attributes)) for e in s.events],
                        error=error,
                        resource=resource,
                    )
                )
    return spans


@dataclass
class Buckets:
    """A histogram point: explicit bounds and each bucket's own count."""

    count: int
    sum: float
    bounds: list[float]
    counts: list[int]


@dataclass
class Point:
    attributes: dict[str, Any]
    value: float | Buckets  # a sum's or a gauge's number, a histogram's buckets


@dataclass
class Series:
    """One metric of an export: its kind (``sum``, ``gauge``, ``histogram``) and points."""

    kind: str
    points: list[Point]
    monotonic: bool = False
    cumulative: bool = False
    start_ns: int = 0  # its points' start time (a sum's, a histogram's)


@dataclass
class MetricsExport:
    """One ``ExportMetricsServiceRequest``: its resource, scopes and metrics by name."""

    resource: dict[str, Any]
    scopes: set[str]
    metrics: dict[str, Series]

    def value(self, name: str, **attributes: str) -> float | Buckets | None:
        """The value of ``name``'s point with exactly ``attributes``, if it has one."""
        series = self.metrics.get(name)
        found = [p.value for p in series.points if p.attributes == attributes] if series else []
        return found[0] if found else None


def _series(metric: Any) -> Series:
    kind = metric.WhichOneof("data")
    data = getattr(metric, kind)
    points: list[Point] = []
    for p in data.data_points:
        if kind == "histogram":
            buckets = Buckets(p.count, p.sum, list(p.explicit_bounds), list(p.bucket_counts))
            points.append(Point(_attrs(p.attributes), buckets))
        else:
            points.append(Point(_attrs(p.attributes), getattr(p, p.WhichOneof("value"))))
    cumulative = getattr(data, "aggregation_temporality", 0) == 2  # CUMULATIVE
    start = data.data_points[0].start_time_unix_nano if data.data_points else 0
    return Series(kind, points, getattr(data, "is_monotonic", False), cumulative, start)


def decode_metrics(body: bytes) -> list[MetricsExport]:
    """The metrics of one ``ExportMetricsServiceRequest``, one export per resource."""
    request = ExportMetricsServiceRequest()
    request.ParseFromString(body)
    return [
        MetricsExport(
            resource=_attrs(rm.resource.attributes),
            scopes={sm.scope.name for sm in rm.scope_metrics},
            metrics={m.name: _series(m) for sm in rm.scope_metrics for m in sm.metrics},
        )
        for rm in request.resource_metrics
    ]


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self.exports: list[MetricsExport] = []  # every metrics export, in order
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    spans = decode(body)
                    with receiver._lock:
                        receiver.spans.extend(spans)
                        receiver.requests += 1
                    reply = ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    exports = decode_metrics(body)
                    with receiver._lock:
                        receiver.exports.extend(exports)
                    reply = ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def env(self, **extra: str) -> dict[str, str]:
        """The ``OTEL_*`` of a process that exports here, at once (a 100 ms batch; its
        metrics every 500 ms)."""
        return {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.url,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
            **extra,
        }

    async def metrics_until(
        self, done: Callable[[MetricsExport], bool], timeout: float = 15.0
    ) -> MetricsExport:
        """The latest metrics export once ``done`` holds for it (else AssertionError), for
        a test whose event loop runs the servers that export."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                latest = self.exports[-1] if self.exports else None
            if latest is not None and done(latest):
                return latest
            await asyncio.sleep(0.05)
        raise AssertionError(f"{len(self.exports)} metrics exports, none as expected")

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait(
        self, trace_id: str, done: Callable[[list[Span]], bool], timeout: float = 15.0
    ) -> list[Span]:
        """The trace's spans once ``done`` holds for them (else AssertionError, with the
        tree as it stands)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            if done(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"trace {trace_id} incomplete:\n{self.tree(trace_id)}")

    async def until(
        self, trace_id: str, done: Callable[[list[Span]], bool], timeout: float = 15.0
    ) -> list[Span]:
        """:meth:`wait`, for a test whose event loop runs the servers that export."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            if done(spans):
                return spans
            await asyncio.sleep(0.05)
        raise AssertionError(f"trace {trace_id} incomplete:\n{self.tree(trace_id)}")

    def tree(self, trace_id: str) -> str:
        """The trace as an indented tree: each span's name, service, duration and
        ``aigcq.*`` / ``messaging.*`` attributes, its events under it."""
        spans = sorted(self.trace(trace_id), key=lambda s: s.start_ns)
        ids = {s.span_id for s in spans}
        children: dict[str, list[Span]] = {}
        for s in spans:
            children.setdefault(s.parent_id if s.parent_id in ids else "", []).append(s)
        lines = [f"trace {trace_id}"]

        def draw(parent: str, depth: int) -> None:
            for s in children.get(parent, []):
                pad = "  " * depth
                shown = {
                    k.removeprefix("messaging."): v
                    for k, v in s.attributes.items()
                    if k not in ("messaging.system", "messaging.message.id")
                }
                error = f" ERROR({s.error})" if s.error is not None else ""
                head = f"{pad}- {s.name} [{s.service}, {s.kind}, {s.duration_ms:.1f} ms]{error}"
                lines.append(f"{head} parent={s.parent_id or '-'} {shown}")
                for name, attrs in s.events:
                    lines.append(f"{pad}    · {name} {attrs}")
                draw(s.span_id, depth + 1)

        draw("", 0)
        return "\n".join(lines)


@contextlib.contextmanager
def exporting(monkeypatch: Any, service: str = "test") -> Iterator[OtlpReceiver]:
    """Tracing on in this process (``monkeypatch``: pytest's, for the ``OTEL_*``), exporting
    to a new receiver; off again after."""
    from aigcq.observability import tracing

    receiver = OtlpReceiver().start()
    for name, value in receiver.env(OTEL_SERVICE_NAME=service).items():
        monkeypatch.setenv(name, value)
    assert tracing.setup()
    try:
        yield receiver
    finally:
        tracing.shutdown()
        receiver.stop()
