"""Issue 41 §1: tracing's switch (the ``OTEL_*`` variables), its W3C contexts, its cost when
off, and what it exports when on (to a real OTLP receiver, tests/fakes/otlp.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from aigcq.observability import tracing
from aigcq.observability.jsonlog import JsonFormatter, TraceIds
from aigcq.queue.store import Claimed
from aigcq.scheduler import traces as traces_module
from aigcq.scheduler.traces import TaskTraces, attempt_parent
from tests.fakes import otlp
from tests.fakes.otlp import OtlpReceiver

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),  # the default: off
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, False),
    ],
)
def test_traces_are_on_only_when_otel_variables_ask(env: dict[str, str], on: bool) -> None:
    assert tracing.wanted(env) is on


def test_a_traceparent_is_read_and_written_as_w3c_says() -> None:
    assert tracing.parse(PARENT) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        1,
    )
    assert tracing.traceparent(*tracing.parse(PARENT) or (0, 0, 0)) == PARENT
    zero = "00-" + "0" * 32 + "-b7ad6b7169203331-01"
    for bad in (None, "", "garbage", zero, "ff" + PARENT[2:], PARENT.upper(), PARENT + "-x"):
        assert tracing.parse(bad) is None, bad
    assert tracing.sampled(PARENT) and not tracing.sampled(PARENT[:-2] + "00")
    assert tracing.parse("01" + PARENT[2:] + "-future") is not None  # a later version's


def test_an_attempts_span_id_is_the_same_in_every_process_and_its_own() -> None:
    one, again, two = (attempt_parent(PARENT, "t-1", n) for n in (1, 1, 2))
    assert one == again != two
    assert one.split("-")[1] == PARENT.split("-")[1]  # the same trace, the same flags
    assert one.endswith("-01") and one.split("-")[2] != PARENT.split("-")[2]
    assert attempt_parent("", "t-1", 1) == ""


def claimed(trace: str = PARENT) -> Claimed:
    return Claimed("t-1", 1, {}, "b", "", time.time(), trace=trace)


def test_off_every_call_returns_at_once_and_nothing_of_the_sdk_is_loaded() -> None:
    assert not tracing.ON
    traces = TaskTraces(None)  # type: ignore[arg-type]  # never touched while off
    with traces.creating("t-1", ("p", "comfyui"), "b", PARENT) as context:
        assert context == ""
    traces.claimed(("p", "comfyui"), "bridge", [claimed()], "own GPU", time.time())
    assert traces.attempt(claimed()) == ""
    traces.attempt_over("t-1", 1, "success")
    traces.delivered("b", {"type": "result", "taskId": "t-1"}, time.time(), reconnected=False)
    assert not traces._jobs
    with tracing.span("x", PARENT, root=True) as s:
        assert s is None
    assert tracing.current_ids() is None


def test_off_a_serve_process_loads_no_tracing_sdk() -> None:
    """With no OTEL_* (the default), assembling a serve process and tracing a task's
    steps imports no part of the OpenTelemetry SDK's tracing."""
    code = (
        "import sys, time\n"
        "import aigcq.serve.server, aigcq.agent.app\n"
        "from aigcq.observability import tracing\n"
        "from aigcq.scheduler.traces import TaskTraces\n"
        "assert not tracing.setup()\n"
        "with tracing.span('x', None, root=True): pass\n"
        "TaskTraces(None).attempt_over('t', 1, 'success')\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk.trace')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_without_the_otel_extra_it_stays_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    assert tracing.setup() is False
    assert not tracing.ON


@pytest.fixture
def exporting(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """Tracing on in this process, exporting to a real OTLP receiver."""
    with otlp.exporting(monkeypatch, "unit") as receiver:
        yield receiver


def test_a_span_recorded_later_keeps_its_times_its_parent_and_its_derived_id(
    exporting: OtlpReceiver,
) -> None:
    own = attempt_parent(PARENT, "t-1", 3)
    tracing.record(
        "process p:comfyui",
        PARENT,
        1_700_000_000.0,
        1_700_000_002.5,
        kind="consumer",
        attributes={"aigcq.attempt": 3},
        events=[("running", 1_700_000_001.0, {"aigcq.note": "r-1"})],
        error="lost",
        own=own,
    )
    tracing.record("unsampled", PARENT[:-2] + "00", 1.0, 2.0)  # its parent is not sampled
    tracing.flush()
    trace_id = PARENT.split("-")[1]
    [span] = exporting.wait(trace_id, bool)
    assert (span.name, span.service, span.kind) == ("process p:comfyui", "unit", "consumer")
    assert span.parent_id == PARENT.split("-")[2]
    assert span.span_id == own.split("-")[2]
    assert (span.start_ns, span.duration_ms) == (1_700_000_000_000_000_000, 2500.0)
    assert span.events == [("running", {"aigcq.note": "r-1"})]
    assert span.error == "lost"
    assert span.attributes == {"aigcq.attempt": 3}


def test_a_json_log_line_carries_the_current_spans_ids(exporting: OtlpReceiver) -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    with tracing.span("create p:comfyui", PARENT) as s:
        TraceIds().filter(record)
    line = json.loads(JsonFormatter().format(record))
    context = s.get_span_context()
    assert line["trace_id"] == PARENT.split("-")[1] == f"{context.trace_id:032x}"
    assert line["span_id"] == f"{context.span_id:016x}"
    outside = logging.LogRecord("x", logging.INFO, __file__, 1, "bye", None, None)
    TraceIds().filter(outside)
    assert "trace_id" not in json.loads(JsonFormatter().format(outside))


def test_on_a_task_known_not_sampled_costs_no_read(exporting: OtlpReceiver) -> None:
    """A task this process claimed whose trace the sampler left out: its attempt's end
    and its delivery read nothing (no job is started)."""
    traces = TaskTraces(None)  # type: ignore[arg-type]  # a read would fail on it
    unsampled = PARENT[:-2] + "00"
    traces.claimed(("p", "comfyui"), "bridge", [claimed(unsampled)], "own GPU", time.time())
    traces.attempt_over("t-1", 1, "success")
    traces.delivered("b", {"type": "result", "taskId": "t-1"}, time.time(), reconnected=False)
    assert not traces._jobs


def test_a_failing_tracer_never_stands_in_a_tasks_way(
    exporting: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the SDK raises, a span is lost and the task's step goes on."""

    class Broken:
        def start_span(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("exporter gone")

    monkeypatch.setattr(tracing, "_tracer", Broken())
    tracing.record("process p:comfyui", PARENT, 1.0, 2.0, own=attempt_parent(PARENT, "t", 1))
    ran = []
    with tracing.span("create p:comfyui", PARENT, root=True) as s:
        ran.append(s)
    assert ran == [None]
    with TaskTraces(None).creating("t-1", ("p", "comfyui"), "b", PARENT) as context:  # type: ignore[arg-type]
        assert context == ""


async def test_spans_past_the_bound_being_recorded_are_dropped_not_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis slow to answer the spans' reads: at most ``JOBS_MAX`` wait, the next is
    dropped (and counted), as the SDK's own full queue drops spans."""
    monkeypatch.setattr(traces_module, "JOBS_MAX", 2)
    traces = TaskTraces(None)  # type: ignore[arg-type]
    slow = asyncio.Event()

    async def recording() -> None:
        await slow.wait()

    jobs = [recording() for _ in range(3)]
    for job in jobs:
        traces._spawn(job)
    assert (len(traces._jobs), traces.dropped) == (2, 1)
    assert jobs[2].cr_frame is None  # closed: never left pending un-awaited
    slow.set()
    await traces.drain()
    assert not traces._jobs


def test_only_otel_variables_that_ask_for_traces_turn_them_on() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    assert not tracing.wanted(env)
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not tracing.wanted({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})
    assert not tracing.wanted({"OTEL_TRACES_EXPORTER": "none"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
