"""Issue 41 §1: each door puts the task's trace inside its client's: the HTTP API, Comfy API
v2 and the message-dispatcher's API read the W3C ``traceparent`` header (the WebSocket's
generate message carries it as a field: tests/e2e/test_traces_e2e.py). In-process serve,
real Redis, real bridge and ComfyUI emulator, tracing on and exported to a real OTLP
receiver."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from rich.console import Console

from aigcq.cli.http_api import Api
from aigcq.cli.status import timeline
from aigcq.domain import TaskState
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from aigcq.platforms.base import Cost, Failed
from aigcq.plumbing.auth import issue_client_token
from tests.fakes.bridge import Bridge
from tests.fakes.client import generate
from tests.fakes.comfyui import E2E_GRAPH
from tests.fakes.fleet import SECRET, Fleet, fleet
from tests.fakes.message_dispatcher import (
    BODY,
    Md,
    fast_checks,
    md,
    md_task_end,
    serve_split,
    serve_split_with_runninghub,
)
from tests.fakes.otlp import OtlpReceiver, Span, exporting
from tests.fakes.paid import paid_stack
from tests.fakes.waiting import until

__all__ = ["fast_checks", "md"]  # fixtures: imported for pytest to find


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    with exporting(monkeypatch, "doors") as r:
        yield r


@pytest.fixture
async def gpu(
    receiver: OtlpReceiver, tmp_path: Path, redis: aioredis.Redis, redis_url: str
) -> AsyncIterator[Fleet]:
    async with fleet(tmp_path, redis, redis_url, [1], paid=0, projects=("aigcq",)) as f:
        yield f


def context() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def ran(spans: list[Span]) -> bool:
    names = {s.name for s in spans}
    return {"create aigcq:comfyui", "process aigcq:comfyui", "process comfyui"} <= names


def _base(f: Fleet) -> str:
    return "http" + f.client.url.split("/?", 1)[0][2:]


async def test_http_and_comfy_v2_submits_continue_the_header_s_trace(
    gpu: Fleet, receiver: OtlpReceiver
) -> None:
    auth = {"Authorization": f"Bearer {issue_client_token(SECRET, 'b1')}"}
    http_parent, http_trace, http_span = context()
    v2_parent, v2_trace, v2_span = context()
    async with httpx.AsyncClient(base_url=_base(gpu)) as http:
        task = generate("http-1", aigc="aigcq", workflowId="e2e-inline", workflow=E2E_GRAPH)
        body = {k: v for k, v in task.items() if k != "type"}
        sent = await http.post(
            "/api/tasks", json=body, headers={**auth, "traceparent": http_parent}
        )
        assert sent.status_code == 202, sent.text
        job = await http.post(
            "/api/v2/jobs", json={"workflow": E2E_GRAPH}, headers={**auth, "traceparent": v2_parent}
        )
        assert job.status_code == 201, job.text
    for trace_id, parent in ((http_trace, http_span), (v2_trace, v2_span)):
        spans = await receiver.until(trace_id, ran)
        print(receiver.tree(trace_id))
        [create] = [s for s in spans if s.name == "create aigcq:comfyui"]
        assert create.parent_id == parent
        [attempt] = [s for s in spans if s.name == "process aigcq:comfyui"]
        [run] = [s for s in spans if s.name == "process comfyui"]
        assert run.parent_id == attempt.span_id
        assert attempt.parent_id == create.span_id
    async with httpx.AsyncClient(base_url=_base(gpu)) as http:
        shown = (await http.get("/api/tasks/http-1", headers=auth)).json()
    assert shown["traceId"] == http_trace  # where an operator finds the task's trace
    token = issue_client_token(SECRET, "b1")
    view = await asyncio.to_thread(timeline, Api(_base(gpu), token), "http-1")
    console = Console(width=160, record=True)
    console.print(view)
    assert f"trace: {http_trace}" in console.export_text()  # `aigcq tasks show`


async def test_a_client_parent_not_sampled_records_nothing_and_shows_no_trace(
    gpu: Fleet, receiver: OtlpReceiver
) -> None:
    """The client's parent says "not sampled" (flags 00): no span of the task is exported,
    and the task's view names no trace id an operator would look for in vain."""
    auth = {"Authorization": f"Bearer {issue_client_token(SECRET, 'b1')}"}
    sampled, sampled_trace, _ = context()
    trace_id = secrets.token_hex(16)
    unsampled = f"00-{trace_id}-{secrets.token_hex(8)}-00"
    async with httpx.AsyncClient(base_url=_base(gpu)) as http:
        for task_id, parent in (("quiet", unsampled), ("loud", sampled)):
            task = generate(task_id, aigc="aigcq", workflowId="e2e-inline", workflow=E2E_GRAPH)
            body = {k: v for k, v in task.items() if k != "type"}
            sent = await http.post("/api/tasks", json=body, headers={**auth, "traceparent": parent})
            assert sent.status_code == 202, sent.text
        await receiver.until(sampled_trace, ran)  # the sampled one ran to its end, exported
        await until(lambda: gpu.task("quiet"), lambda t: t.state.value == "success", within=15)
        shown = (await http.get("/api/tasks/quiet", headers=auth)).json()
    assert shown["traceId"] is None
    assert receiver.trace(trace_id) == []


async def test_a_dispatcher_api_submit_continues_the_header_s_trace(
    md: Md, monkeypatch: pytest.MonkeyPatch
) -> None:
    with exporting(monkeypatch, "md") as receiver:
        parent, trace_id, span_id = context()
        token = await md.token()
        resp = await md.http.post(
            "/api/task", json={**BODY, "apiKey": token}, headers={"traceparent": parent}
        )
        assert resp.status_code == 200, resp.text
        task_id = resp.json()["data"]["taskId"]
        spans = await receiver.until(
            trace_id, lambda got: any(s.name.startswith("create") for s in got)
        )
        [create] = spans
        assert create.parent_id == span_id
        assert create.attributes["messaging.message.id"] == task_id
        stored = await md.task(task_id)
        assert stored is not None


@pytest.mark.usefixtures("fast_checks")
async def test_in_the_split_topology_the_dispatchers_task_goes_on_in_the_attempt(
    md: Md, tmp_path: Path, redis: aioredis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve → message-dispatcher → bridge: the dispatcher's own task (its create, its
    attempt on the bridge) is in the serve task's trace, under the serve's attempt."""
    bridge = await Bridge.connect(md.port)
    await bridge.register(count=1)
    with exporting(monkeypatch, "split") as receiver:
        async with serve_split(tmp_path, redis, redis_url, md.base) as (service, client):
            parent, trace_id, span_id = context()
            reply = await client.request({**generate("split-1"), "traceparent": parent})
            assert reply["type"] != "error", reply
            assign = await bridge.next(timeout=10)
            assert assign["data"]["traceparent"].split("-")[1] == trace_id
            await bridge.ack(assign["data"]["taskId"])
            await until(
                lambda: service.rt.store.reads.get("split-1"),
                lambda t: t is not None and t.state == "running",
            )
            await md_task_end(md, assign["data"]["webhookUrl"])
            assert (await client.next(timeout=10))["status"] == "success"

            def both(spans: list[Span]) -> bool:
                return len([s for s in spans if s.name.startswith("process ")]) == 2

            spans = await receiver.until(trace_id, both)
        print(receiver.tree(trace_id))
        serve_create, md_create = sorted(
            (s for s in spans if s.name.startswith("create ")), key=lambda s: s.start_ns
        )
        assert serve_create.parent_id == span_id
        [serve_attempt] = [
            s
            for s in spans
            if s.attributes.get("aigcq.target") == "message_dispatcher"
            and s.name.startswith("process")
        ]
        assert md_create.parent_id == serve_attempt.span_id
        [md_attempt] = [s for s in spans if s.name.startswith("process") and s is not serve_attempt]
        assert md_attempt.parent_id == md_create.span_id
        assert assign["data"]["traceparent"].split("-")[2] == md_attempt.span_id
    await bridge.ws.close()


@pytest.mark.usefixtures("fast_checks")
async def test_an_overflow_to_runninghub_in_process_has_its_paid_spans(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its message-dispatcher unreachable, a serve sends the task to RunningHub: the
    decision says overflow, the create is a send span under the attempt, the attempt says
    paid, its account and its cost (an estimate: no money reported, no price set)."""
    with exporting(monkeypatch, "paid") as receiver:
        async with serve_split_with_runninghub(
            tmp_path, redis, redis_url, "http://127.0.0.1:9", duration_s=0.1
        ) as (_, client):
            parent, trace_id, span_id = context()
            await client.request({**generate("paid-1"), "traceparent": parent})
            assert (await client.next(timeout=10))["status"] == "success"

            def paid(spans: list[Span]) -> bool:
                names = {s.name for s in spans}
                return {"process proj:comfyui", "send runninghub", "settle proj:comfyui"} <= names

            spans = await receiver.until(trace_id, paid)
        print(receiver.tree(trace_id))
        by_name = {s.name: s for s in spans}
        assert by_name["create proj:comfyui"].parent_id == span_id
        attempt = by_name["process proj:comfyui"]
        assert attempt.attributes["aigcq.target"] == "runninghub"
        assert attempt.attributes["aigcq.paid"] is True
        assert attempt.attributes["aigcq.account"]
        assert attempt.attributes["aigcq.cost"] == 0.0
        assert attempt.attributes["aigcq.cost.estimate"] is True
        send = by_name["send runninghub"]
        assert send.parent_id == attempt.span_id
        assert send.attributes["aigcq.create.outcome"] == "Accepted"
        receives = [s for s in spans if s.name == "receive proj:comfyui"]
        assert receives[-1].attributes["aigcq.target"] == "runninghub"


async def test_a_retried_paid_attempt_s_span_carries_what_it_cost(
    tmp_path: Path, redis: aioredis.Redis, redis_url: str, receiver: OtlpReceiver
) -> None:
    """A paid run fails with a failure its platform documents as retryable: the task is
    sent again, and the span of the attempt that failed says what that run cost, as any
    paid attempt's does (was: no cost on a retried attempt)."""
    rh = RunningHubEmulatorConfig(duration_s=60, max_concurrent=5)
    async with paid_stack(tmp_path, redis, redis_url, rh=rh, sweep_interval_s=3600) as env:
        parent, trace_id, _ = context()
        await env.client.request({**generate("retried"), "traceparent": parent})
        task = await until(partial(env.task, "retried"), lambda t: t.state is TaskState.RUNNING)
        failed = Failed("805", "busy, try again", retryable=True, cost=Cost(money=0.25))
        moved = await env.service.lifecycle.settle(
            "retried", failed, "callback", task.attempt, target="runninghub"
        )
        assert moved is not None and moved.state is TaskState.PENDING

        def retried(spans: list[Span]) -> bool:
            return any(s.attributes.get("aigcq.outcome") == "retry" for s in spans)

        spans = await receiver.until(trace_id, retried)
        [attempt] = [s for s in spans if s.attributes.get("aigcq.outcome") == "retry"]
        assert attempt.attributes["aigcq.attempt"] == task.attempt
        assert attempt.attributes["aigcq.paid"] is True
        assert attempt.attributes["aigcq.cost"] == 0.25
        assert attempt.attributes["aigcq.cost.estimate"] is False
