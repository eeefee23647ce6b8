"""A real OTLP/HTTP trace receiver: what a collector decodes, kept for the tests to read.

``OtlpReceiver().start()`` listens on 127.0.0.1 (a free port) for ``POST /v1/traces``
(``application/x-protobuf``, gzip or not), decodes each ``ExportTraceServiceRequest`` with
``opentelemetry-proto`` and keeps its spans (:class:`Span`), answering as a collector
does. :meth:`OtlpReceiver.tree` prints a trace as a viewer draws it.
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


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                spans = decode(body)
                with receiver._lock:
                    receiver.spans.extend(spans)
                    receiver.requests += 1
                reply = ExportTraceServiceResponse().SerializeToString()
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
        """The ``OTEL_*`` of a process that exports here, at once (a 100 ms batch)."""
        return {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.url,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            **extra,
        }

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
