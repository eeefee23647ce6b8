"""OpenTelemetry traces, configured by the standard ``OTEL_*`` variables; off by default.

Tracing is on in a process when :func:`setup` found an exporter asked for
(``OTEL_TRACES_EXPORTER=otlp`` or ``console``, or an ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), ``OTEL_SDK_DISABLED`` is not ``true`` and the
``otel`` extra (``opentelemetry-sdk``, ``opentelemetry-exporter-otlp-proto-http``) is
installed. The SDK reads the rest itself: the sampler (``OTEL_TRACES_SAMPLER``, ``_ARG``),
the service name and resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``), the
batch (``OTEL_BSP_*``) and the exporter's endpoint, headers and timeout.

Off (the default), nothing of OpenTelemetry is imported and :data:`ON` is False: callers
test it before doing anything (one attribute read), so tracing off costs nothing.

A task's trace crosses processes: its context is kept with the task in Redis as a W3C
``traceparent`` (:func:`traceparent`), and a span that began in one process and ends in
another is recorded where it ends, with explicit start and end times (:func:`record`). A
span whose id must be known before it is recorded (a task's attempt: the bridge continues
the trace under it while it runs) takes an id derived from the task, so any process
names the same span (:func:`derived`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import os
import re
import socket
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

#: tracing is set up in this process (:func:`setup`); test it before anything else
ON = False

#: what an attribute value may be
Attr = str | bool | int | float
Attrs = Mapping[str, Attr]

MESSAGING_SYSTEM = "aigcq"

_tracer: Any = None
_provider: Any = None
#: the span id the next span started in this context takes (a derived one), else random
_next_span_id: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "aigcq_next_span_id", default=None
)

_TRUE = {"true", "1", "yes", "on"}
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\Z")


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``env`` (the environment) asks for traces."""
    env = os.environ if env is None else env
    if sdk_disabled(env):
        return False
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",")}
    exporters.discard("")
    if exporters:
        return bool(exporters - {"none"})
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def sdk_disabled(env: Mapping[str, str]) -> bool:
    """Whether ``env`` turns every signal off (``OTEL_SDK_DISABLED=true``)."""
    return env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE


def setup(service: str = "aigcq") -> bool:
    """Turn tracing on in this process when the environment asks for it (see the module's
    text); ``service``: the service name unless ``OTEL_SERVICE_NAME`` names one. Once per
    process (the entry points call it); True when on."""
    global ON, _tracer, _provider
    if ON or not wanted():
        return ON
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        exporters = _exporters()
    except ImportError as exc:
        log.warning("OTEL_* asks for traces, but the otel extra is not installed (%s)", exc)
        return False
    if not exporters:
        log.warning("OTEL_TRACES_EXPORTER names no exporter aigcq ships (otlp, console)")
        return False
    provider = TracerProvider(resource=resource(service), id_generator=_ids())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    # Not the global provider: the libraries that trace on their own once one is set
    # (FastAPI's HTTP and WebSocket spans, several per request) stay off; a task's trace
    # is aigcq's spans only.
    _provider, _tracer = provider, provider.get_tracer("aigcq")
    ON = True
    log.info("OpenTelemetry traces on (%s)", os.environ.get("OTEL_TRACES_EXPORTER") or "otlp")
    return True


def resource(service: str) -> Any:
    """The Resource of this process's telemetry (traces and metrics): ``OTEL_SERVICE_NAME``
    and ``OTEL_RESOURCE_ATTRIBUTES``; the service name ``service`` unless one is named, and
    a ``service.instance.id`` (host-pid) unless one is or the SDK made one (recent SDKs
    do): the workers of one ``aigcq serve`` share their environment, and each one's
    counters must be series of their own."""
    from opentelemetry.sdk.resources import Resource

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
    created = Resource.create(attributes)
    if "service.instance.id" in created.attributes:
        return created
    return created.merge(Resource({"service.instance.id": f"{socket.gethostname()}-{os.getpid()}"}))


def _exporters() -> list[Any]:
    names = {e.strip().lower() for e in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    out: list[Any] = []
    if "otlp" in names or not names - {""}:
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        if protocol != "http/protobuf":
            log.warning("OTLP protocol %r: only http/protobuf is shipped; using it", protocol)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        out.append(OTLPSpanExporter())
    if "console" in names:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        out.append(ConsoleSpanExporter())
    return out


def _ids() -> Any:
    """Random ids, except a span started under :func:`derived`'s id."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class _Ids(RandomIdGenerator):
        def generate_span_id(self) -> int:
            wanted_id = _next_span_id.get()
            return wanted_id if wanted_id is not None else super().generate_span_id()

    return _Ids()


@contextlib.asynccontextmanager
async def in_process(service: str) -> AsyncIterator[bool]:
    """Around a process's life (``aigcq serve``, ``dispatcher``, ``bridge``): tracing
    set up as the environment asks (yields whether it is on), and what is batched sent
    at its end."""
    on = setup(service)
    try:
        yield on
    finally:
        if on:
            await asyncio.to_thread(shutdown)


def shutdown() -> None:
    """Send what is batched and stop (a process's end)."""
    global ON, _tracer, _provider
    provider, ON, _tracer, _provider = _provider, False, None, None
    if provider is not None:
        with contextlib.suppress(Exception):
            provider.shutdown()


def flush(timeout_s: float = 5.0) -> None:
    """Send what is batched now."""
    if _provider is not None:
        _provider.force_flush(int(timeout_s * 1000))


# ---- contexts ---------------------------------------------------------------------------


def parse(traceparent: str | None) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a W3C ``traceparent``, None if it is not one."""
    found = _TRACEPARENT.match(traceparent.strip()) if traceparent else None
    if found is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = found.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, int(flags_hex, 16)


def traceparent(trace_id: int, span_id: int, flags: int = 1) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


def sampled(traceparent_: str | None) -> bool:
    """Whether spans under ``traceparent_`` are recorded (its sampled flag)."""
    found = parse(traceparent_)
    return found is not None and bool(found[2] & 1)


def derived(parent: str, *names: object) -> str:
    """The ``traceparent`` of the span named by ``names`` under ``parent`` (same trace and
    flags; its span id a hash of the trace id and ``names``): every process names the same
    span, e.g. a task's attempt n. "" if ``parent`` is not a traceparent."""
    found = parse(parent)
    if found is None:
        return ""
    trace_id, _, flags = found
    seed = ":".join([f"{trace_id:032x}", *map(str, names)]).encode()
    span_id = int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest(), "big") or 1
    return traceparent(trace_id, span_id, flags)


def _context(parent: str | None) -> Any:
    """The OpenTelemetry context whose span is ``parent`` (remote); None: a new root."""
    found = parse(parent)
    if found is None:
        return None
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    trace_id, span_id, flags = found
    ctx = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 1))
    return trace.set_span_in_context(NonRecordingSpan(ctx))


def _kind(kind: str) -> Any:
    from opentelemetry.trace import SpanKind

    return getattr(SpanKind, kind.upper())


def _ns(epoch_s: float) -> int:
    return int(epoch_s * 1e9)


def traceparent_of(span: Any) -> str:
    """The ``traceparent`` of a live span."""
    c = span.get_span_context()
    return traceparent(c.trace_id, c.span_id, int(c.trace_flags))


# ---- spans ------------------------------------------------------------------------------


@contextlib.contextmanager
def span(
    name: str,
    parent: str | None = None,
    *,
    kind: str = "internal",
    attributes: Attrs | None = None,
    current: bool = True,
    root: bool = False,
) -> Iterator[Any]:
    """A span around a block, child of ``parent`` (a traceparent). Without one (None or
    invalid), a new root with ``root``, else no span. ``current``: the block's log lines
    carry its ids. Yields the span (None when tracing is off, or no span)."""
    ctx = _context(parent) if ON else None
    if ctx is None and not (ON and root):
        yield None
        return
    try:
        s = _tracer.start_span(name, context=ctx, kind=_kind(kind), attributes=attributes)
    except Exception as exc:  # tracing never stands in a task's way
        _lost(name, exc)
        yield None
        return
    try:
        if current:
            from opentelemetry import trace

            with trace.use_span(
                s, end_on_exit=False, record_exception=False, set_status_on_exception=False
            ):
                yield s
        else:
            yield s
    except BaseException as exc:
        failed(s, exc)
        raise
    finally:
        with contextlib.suppress(Exception):
            s.end()


def record(
    name: str,
    parent: str,
    start_s: float,
    end_s: float,
    *,
    kind: str = "internal",
    attributes: Attrs | None = None,
    events: Sequence[tuple[str, float, Attrs]] = (),
    error: str = "",
    own: str = "",
) -> None:
    """A span that already happened, from ``start_s`` to ``end_s`` (epoch s), child of
    ``parent``; ``events``: (name, epoch s, attributes); ``error``: its status is ERROR
    with that description; ``own``: its own traceparent (a :func:`derived` one), else a
    new id. Nothing when tracing is off or ``parent`` is not sampled."""
    if not ON or not sampled(parent):
        return
    try:
        _record(name, parent, start_s, end_s, kind, attributes, events, error, own)
    except Exception as exc:  # tracing never stands in a task's way
        _lost(name, exc)


def _record(
    name: str,
    parent: str,
    start_s: float,
    end_s: float,
    kind: str,
    attributes: Attrs | None,
    events: Sequence[tuple[str, float, Attrs]],
    error: str,
    own: str,
) -> None:
    found = parse(own)
    token = _next_span_id.set(found[1]) if found is not None else None
    try:
        s = _tracer.start_span(
            name,
            context=_context(parent),
            kind=_kind(kind),
            attributes=attributes,
            start_time=_ns(start_s),
        )
    finally:
        if token is not None:
            _next_span_id.reset(token)
    for event, at, attrs in events:
        s.add_event(event, attributes=attrs, timestamp=_ns(at))
    if error:
        from opentelemetry.trace import Status, StatusCode

        s.set_status(Status(StatusCode.ERROR, error))
    s.end(end_time=_ns(max(end_s, start_s)))


def failed(s: Any, error: BaseException | str) -> None:
    """Mark live span ``s`` failed (an exception, or a description)."""
    if s is None:
        return
    from opentelemetry.trace import Status, StatusCode

    with contextlib.suppress(Exception):
        if isinstance(error, BaseException):
            s.record_exception(error)
            error = f"{type(error).__name__}: {error}"
        s.set_status(Status(StatusCode.ERROR, error))


def _lost(name: str, exc: Exception) -> None:
    log.debug("span %s not recorded: %r", name, exc)


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) in hex of the span current in this context, if tracing is on
    and one is (for log lines)."""
    if not ON:
        return None
    from opentelemetry import trace

    c = trace.get_current_span().get_span_context()
    if not c.is_valid:
        return None
    return f"{c.trace_id:032x}", f"{c.span_id:016x}"


def messaging(
    operation: str, kind: str, destination: str, message_id: str, extra: Attrs | None = None
) -> dict[str, Attr]:
    """The messaging semantic conventions' attributes of a span (plus ``extra``)."""
    return {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.name": operation,
        "messaging.operation.type": kind,
        "messaging.destination.name": destination,
        "messaging.message.id": message_id,
        **(extra or {}),
    }
