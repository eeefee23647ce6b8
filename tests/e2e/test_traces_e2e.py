"""Issue 41 §1: a task's life as one OpenTelemetry trace, read by a real OTLP receiver.

Real processes (``aigcq serve``, ``aigcq bridge``, the ComfyUI and RunningHub emulators, a
private Redis) export with the standard ``OTEL_*`` variables to :class:`OtlpReceiver`,
which decodes what they send as a collector does; each test prints the trace's tree.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.e2e.test_bridge_e2e import Setup
from tests.fakes.client import Client, bridge_task
from tests.fakes.otlp import OtlpReceiver, Span
from tests.fakes.processes import Cluster
from tests.fakes.waiting import until

pytestmark = pytest.mark.e2e


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """A receiver, and every process the test starts exporting to it."""
    r = OtlpReceiver().start()
    for name, value in r.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    try:
        yield r
    finally:
        r.stop()


def client_context() -> tuple[str, str, str]:
    """A business backend's own span: (traceparent, trace id, span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def named(spans: list[Span], prefix: str) -> list[Span]:
    return [s for s in spans if s.name.startswith(prefix)]


def one(spans: list[Span], prefix: str) -> Span:
    found = named(spans, prefix)
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def has(*prefixes: str) -> Any:
    return lambda spans: all(named(spans, p) for p in prefixes)


async def test_a_bridge_task_is_one_trace_inside_the_clients(
    cluster: Cluster, receiver: OtlpReceiver
) -> None:
    """Submitted with the client's traceparent over the WebSocket, run on a bridge: create,
    wait, receive (own GPU), process (the attempt, recorded by serve) with the bridge's
    ComfyUI run under it (the nodes as events), settle: one trace, the client's span its
    root's parent."""
    s = Setup(cluster).start(rh_cap=0)
    parent, trace_id, client_span = client_context()
    client = await Client(s.port, "biz-trace").connect()
    reply = await client.request({**bridge_task("tr-1"), "traceparent": parent})
    assert reply["type"] == "submitted", reply
    await client.collect(1, timeout=20)
    assert client.results["tr-1"][0]["status"] == "success"
    await client.close()

    spans = receiver.wait(
        trace_id, has("create", "wait", "receive", "process proj", "process comfyui", "settle")
    )
    print(receiver.tree(trace_id))
    create = one(spans, "create proj:comfyui")
    assert create.parent_id == client_span
    assert (create.service, create.kind) == ("aigcq", "producer")
    assert create.attributes["messaging.system"] == "aigcq"
    assert create.attributes["messaging.operation.type"] == "create"
    assert create.attributes["messaging.destination.name"] == "proj:comfyui"
    assert create.attributes["messaging.message.id"] == "tr-1"
    for name in ("wait proj:comfyui", "receive proj:comfyui", "process proj:comfyui", "settle"):
        assert one(spans, name).parent_id == create.span_id, name
    receive = one(spans, "receive proj:comfyui")
    assert receive.attributes["aigcq.dispatch.reason"] == "own GPU (bridge)"
    assert receive.attributes["aigcq.target"] == "bridge"
    attempt = one(spans, "process proj:comfyui")
    assert attempt.attributes["aigcq.outcome"] == "success"
    assert attempt.attributes["aigcq.attempt"] == 1
    assert [e for e, _ in attempt.events][:2] == ["dispatching", "running"]
    run = one(spans, "process comfyui")
    assert run.service == "aigcq-bridge"
    assert run.parent_id == attempt.span_id  # the bridge continues the attempt's span
    assert attempt.start_ns <= run.start_ns and run.end_ns <= attempt.end_ns
    nodes = [a.get("comfyui.node.id") for e, a in run.events if e == "executing"]
    assert len(nodes) == 3, run.events  # E2E_GRAPH's three nodes, each an event
    settle = one(spans, "settle")
    assert settle.attributes["messaging.operation.type"] == "settle"
    assert settle.start_ns >= attempt.end_ns
    assert {s.trace_id for s in spans} == {trace_id}
    # the serve's metrics go through OTLP too: the task counted where /metrics counts it
    done = {"aigc": "proj", "platform": "comfyui", "target": "bridge", "outcome": "success"}
    export = await receiver.metrics_until(lambda e: e.value("aigcq_tasks_finished", **done) == 1)
    assert export.resource["service.name"] == "aigcq"


async def test_a_task_overflowed_to_runninghub_has_a_paid_span_with_its_cost(
    cluster: Cluster, receiver: OtlpReceiver
) -> None:
    """No bridge: the task overflows to the RunningHub emulator, which bills 0.25 a task;
    its attempt's span carries the cost, currency and account, its create a send span."""
    rh = cluster.emulator("runninghub", "--duration", "0.2", "--consume-money", "0.25")
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 2}}})
    _, port = cluster.server(AIGCQ_RUNNINGHUB_URL=rh, AIGCQ_HEALTH_INTERVAL_S="0.2")
    parent, trace_id, client_span = client_context()
    client = await Client(port, "biz-paid").connect()
    reply = await client.request({**bridge_task("tr-paid"), "traceparent": parent})
    assert reply["type"] == "submitted", reply
    await client.collect(1, timeout=20)
    assert client.results["tr-paid"][0]["status"] == "success"
    await client.close()

    spans = receiver.wait(
        trace_id, has("create", "receive", "send runninghub", "process", "settle")
    )
    print(receiver.tree(trace_id))
    create = one(spans, "create proj:comfyui")
    assert create.parent_id == client_span
    receive = one(spans, "receive proj:comfyui")
    assert receive.attributes["aigcq.target"] == "runninghub"
    assert receive.attributes["aigcq.dispatch.reason"] == "overflow"
    paid = one(spans, "process proj:comfyui")
    assert paid.attributes["aigcq.target"] == "runninghub"
    assert paid.attributes["aigcq.paid"] is True
    assert paid.attributes["aigcq.cost"] == pytest.approx(0.25)
    assert paid.attributes["aigcq.cost.currency"] == "CNY"
    assert paid.attributes["aigcq.cost.estimate"] is False
    assert paid.attributes["aigcq.account"]
    assert paid.attributes["aigcq.remote_id"]
    send = one(spans, "send runninghub")
    assert send.parent_id == paid.span_id
    assert send.attributes["aigcq.remote_id"] == paid.attributes["aigcq.remote_id"]


async def test_tracing_is_off_without_otel_variables(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No OTEL_* asking for traces (the default): a serve process records nothing of a task
    a client sent with its traceparent: no trace is kept with the task."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    s = Setup(cluster).start(rh_cap=0)
    parent, _, _ = client_context()
    client = await Client(s.port, "biz-untraced").connect()
    reply = await client.request({**bridge_task("tr-off"), "traceparent": parent})
    assert reply["type"] == "submitted", reply
    await client.collect(1, timeout=20)
    assert client.results["tr-off"][0]["status"] == "success"
    await client.close()
    task = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    try:
        assert task.hget("aigcq:task:tr-off", "trace") in (None, "")
    finally:
        task.close()


async def test_a_task_retried_on_another_serve_after_a_kill_is_still_one_trace(
    cluster: Cluster, receiver: OtlpReceiver
) -> None:
    """Submitted to serve A, run on A's bridge, A killed (SIGKILL): B's sweep retries it
    past its deadline on B's bridge, the client comes back on B for its result. One trace:
    A's create and attempt 1's decision, attempt 1's end recorded by B (A is gone),
    attempt 2 on B, the delivery after the reconnect; each TASK_ASSIGN names its attempt's
    span."""
    from aigcq.observability import tracing
    from tests.e2e.test_two_serves_e2e import assigned, result
    from tests.fakes.bridge import Bridge, post_task_end
    from tests.fakes.processes import BRIDGE_TOKEN

    rh = cluster.emulator("runninghub")
    cluster.write_models({"proj": {"comfyui": {"apikey": "k" * 32, "concurrency": 0}}})
    a_proc, a = cluster.server(
        AIGCQ_RUNNINGHUB_URL=rh,
        AIGCQ_TASK_DEADLINE_S="2",
        OTEL_RESOURCE_ATTRIBUTES="service.instance.id=serve-a",
    )
    _, b = cluster.server(
        AIGCQ_RUNNINGHUB_URL=rh,
        AIGCQ_TASK_DEADLINE_S="2",
        OTEL_RESOURCE_ATTRIBUTES="service.instance.id=serve-b",
    )
    parent, trace_id, client_span = client_context()

    first = await Bridge.connect(a, BRIDGE_TOKEN)
    await first.register("on-a", count=1)
    client = await Client(a, "biz-kill").connect()
    reply = await client.request({**bridge_task("kill-1"), "traceparent": parent})
    assert reply["type"] == "submitted", reply
    one_attempt = await assigned(first, "kill-1")
    redis_client = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    await until_running(redis_client, "kill-1", 1)
    receiver.wait(trace_id, has("create", "receive"))  # A's batch is out before it dies
    a_proc.kill()
    await client.ws.close()

    second = await Bridge.connect(b, BRIDGE_TOKEN)
    await second.register("on-b", count=1)
    two_attempt = await assigned(second, "kill-1")  # B's sweep, past attempt 1's deadline
    assert two_attempt["attempt"] == 2
    await until_running(redis_client, "kill-1", 2)
    assert await post_task_end(f"http://127.0.0.1:{b}", two_attempt["webhookUrl"]) == 200
    again = await Client(b, "biz-kill").connect()
    assert (await result(again, "kill-1"))["status"] == "success"
    await again.close()
    redis_client.close()

    spans = receiver.wait(
        trace_id, lambda got: len(named(got, "process proj")) == 2 and bool(named(got, "settle"))
    )
    print(receiver.tree(trace_id))
    create = one(spans, "create proj:comfyui")
    assert create.parent_id == client_span
    assert create.resource["service.instance.id"] == "serve-a"
    by_attempt = {s.attributes["aigcq.attempt"]: s for s in named(spans, "process proj")}
    assert by_attempt[1].attributes["aigcq.outcome"] == "retry"
    assert by_attempt[1].resource["service.instance.id"] == "serve-b"  # A was dead
    assert by_attempt[2].attributes["aigcq.outcome"] == "success"
    for n, assign in ((1, one_attempt), (2, two_attempt)):
        assert by_attempt[n].parent_id == create.span_id
        assert assign["traceparent"] == tracing.traceparent(
            int(trace_id, 16), int(by_attempt[n].span_id, 16)
        )
    receives = {s.attributes["aigcq.attempt"]: s for s in named(spans, "receive")}
    assert receives[1].resource["service.instance.id"] == "serve-a"
    assert receives[2].resource["service.instance.id"] == "serve-b"
    settle = one(spans, "settle")
    assert settle.resource["service.instance.id"] == "serve-b"
    assert settle.attributes["aigcq.delivery.reconnected"] is True
    assert {s.trace_id for s in spans} == {trace_id}


async def until_running(r: redis.Redis, task_id: str, attempt: int) -> None:
    def state() -> Any:
        return r.hmget(f"aigcq:task:{task_id}", ["status", "attempt"])

    await until(lambda: asyncio.to_thread(state), lambda got: got == ["running", str(attempt)], 10)
