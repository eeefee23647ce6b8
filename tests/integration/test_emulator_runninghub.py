"""The RunningHub emulator served for real, driven over HTTP and through the adapter."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from aigcq.domain import Task
from aigcq.emulators._webhook import WebhookPoster
from aigcq.emulators.runninghub import RunningHubEmulatorConfig, create_app
from aigcq.platforms.base import Accepted, Failed, Full, NotFound, Pending, Rejected, Succeeded
from aigcq.platforms.runninghub import RunningHubAdapter
from tests.fakes.processes import reserved_port, wait_http
from tests.fakes.servers import Recorder, send, serve_app
from tests.fakes.waiting import until

KEY = "k" * 32
NODES = [{"nodeId": "6", "fieldName": "text", "fieldValue": "a cat"}]


@contextlib.asynccontextmanager
async def emulator(**options: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A running emulator (tasks last 0.1 s unless told) and a client bound to it."""
    config = RunningHubEmulatorConfig(**{"duration_s": 0.1, **options})
    async with serve_app(create_app(config)) as base, httpx.AsyncClient(base_url=base) as client:
        yield client


@contextlib.asynccontextmanager
async def receiver(**options: Any) -> AsyncIterator[tuple[Recorder, str]]:
    recorder = Recorder(**options)
    async with serve_app(recorder.app) as base:
        yield recorder, base


async def call(client: httpx.AsyncClient, path: str, **body: Any) -> Any:
    response = await client.post(path, json=body)
    assert response.status_code == 200
    return response.json()


async def create(client: httpx.AsyncClient, **extra: Any) -> Any:
    return await call(
        client, "/task/openapi/create", apiKey=KEY, workflowId="1904", nodeInfoList=NODES, **extra
    )


async def test_create_then_webhook_carries_the_outputs_as_a_json_string() -> None:
    async with receiver() as (recorder, hook_base), emulator() as client:
        hook = f"{hook_base}/callback/all?sig=a%2Bb&t=1"
        created = await create(client, webhookUrl=hook, instanceType="plus")
        assert created["code"] == 0
        task_id = created["data"]["taskId"]
        assert isinstance(task_id, str) and len(task_id) == 19 and task_id.isdigit()
        assert created["data"]["taskStatus"] == "RUNNING"
        assert json.loads(created["data"]["promptTips"])["result"] is True

        [hit] = await recorder.wait_for(1)
        assert (hit.method, hit.path, hit.query) == ("POST", "/callback/all", "sig=a%2Bb&t=1")
        event = hit.json()
        assert (event["event"], event["taskId"]) == ("TASK_END", task_id)
        assert isinstance(event["eventData"], str)
        outputs = await call(client, "/task/openapi/outputs", apiKey=KEY, taskId=task_id)
        assert json.loads(event["eventData"]) == outputs
        assert outputs["code"] == 0

        image = await client.get(outputs["data"][0]["fileUrl"])
        assert image.status_code == 200
        assert image.headers["content-type"] == "image/png"
        assert image.content.startswith(b"\x89PNG\r\n\x1a\n")


async def test_queue_cap_answers_421_until_a_task_ends() -> None:
    async with emulator(max_concurrent=2, duration_s=0.5) as client:
        first, second, third = [await create(client) for _ in range(3)]
        assert first["code"] == second["code"] == 0
        assert third == {"code": 421, "msg": "TASK_QUEUE_MAXED", "data": None}
        other_key = await call(
            client, "/task/openapi/create", apiKey="other", workflowId="1904", nodeInfoList=[]
        )
        assert other_key["code"] == 0  # the cap is per key

        async def account() -> Any:
            return await call(client, "/uc/openapi/accountStatus", apikey=KEY)

        assert (await account())["data"]["currentTaskCounts"] == "2"
        await until(account, lambda a: a["data"]["currentTaskCounts"] == "0")
        assert (await create(client))["code"] == 0

        stats = (await client.get("/_emulator/stats")).json()
        assert stats["created"] == 4
        assert stats["rejected_full"] == 1
        assert stats["peak_concurrent"] == {KEY: 2, "other": 1}
        assert stats["current"][KEY] == 1  # the "other" task may not have ended yet
        assert stats["creates_per_workflow"] == {"1904": 4}


async def test_status_and_outputs_progress_from_queued_to_success() -> None:
    async with emulator(queue_s=0.4, duration_s=0.4) as client:
        created = await create(client)
        assert created["data"]["taskStatus"] == "QUEUED"
        task = {"apiKey": KEY, "taskId": created["data"]["taskId"]}

        async def status() -> Any:
            return await call(client, "/task/openapi/status", **task)

        async def outputs() -> Any:
            return await call(client, "/task/openapi/outputs", **task)

        assert await status() == {"code": 0, "msg": "success", "data": "QUEUED"}
        assert (await outputs())["code"] == 813
        await until(status, lambda s: s["data"] == "RUNNING")
        assert await outputs() == {"code": 804, "msg": "APIKEY_TASK_IS_RUNNING", "data": None}
        await until(status, lambda s: s["data"] == "SUCCESS")
        done = await outputs()
        assert done["code"] == 0
        assert set(done["data"][0]) == {
            *("fileUrl", "fileType", "taskCostTime", "nodeId"),
            *("consumeCoins", "consumeMoney", "thirdPartyConsumeMoney"),  # as runninghub-sdk reads
        }
        assert done["data"][0]["consumeCoins"] == "10" and done["data"][0]["consumeMoney"] is None


async def test_failed_task_reports_805_with_failed_reason_everywhere() -> None:
    async with receiver() as (recorder, hook), emulator(failure_rate=1.0, duration_s=0) as client:
        task_id = (await create(client, webhookUrl=hook))["data"]["taskId"]
        [hit] = await recorder.wait_for(1)
        event_data = json.loads(hit.json()["eventData"])
        assert event_data["code"] == 805
        assert event_data["msg"] == "APIKEY_TASK_STATUS_ERROR"
        assert event_data["data"]["failedReason"]["exception_message"]
        task = {"apiKey": KEY, "taskId": task_id}
        assert await call(client, "/task/openapi/outputs", **task) == event_data
        assert (await call(client, "/task/openapi/status", **task))["data"] == "FAILED"
        assert (await client.get(f"/files/{task_id}/output.png")).status_code == 404


async def test_cancel_ends_the_task_and_frees_its_slot() -> None:
    async with receiver() as (recorder, hook), emulator(max_concurrent=1, duration_s=30) as client:
        task = {"apiKey": KEY, "taskId": (await create(client, webhookUrl=hook))["data"]["taskId"]}
        assert (await create(client))["code"] == 421
        assert await call(client, "/task/openapi/cancel", **task) == {
            "code": 0,
            "msg": "success",
            "data": None,
        }
        assert (await call(client, "/task/openapi/status", **task))["data"] == "FAILED"
        [hit] = await recorder.wait_for(1)
        assert json.loads(hit.json()["eventData"])["code"] == 805
        stats = (await client.get("/_emulator/stats")).json()
        assert (stats["cancelled"], stats["current"]) == (1, {})
        unknown = await call(client, "/task/openapi/cancel", apiKey=KEY, taskId="1")
        assert unknown["code"] == 807
        other_key = await call(client, "/task/openapi/status", apiKey="x", taskId=task["taskId"])
        assert other_key["code"] == 807


async def test_account_status_reads_apikey_or_apiKey_and_answers_string_numbers() -> None:
    async with emulator(api_keys={KEY}) as client:
        answer = await call(client, "/uc/openapi/accountStatus", apikey=KEY)
        assert answer["code"] == 0
        data = answer["data"]
        assert isinstance(data["remainCoins"], str) and isinstance(data["currentTaskCounts"], str)
        assert data["apiType"] == "NORMAL"
        # RunningHub's documented field is lowercase, but its clients (runninghub-sdk) send
        # apiKey, as on every other route, and RunningHub answers them (issue 18, item 14)
        assert (await call(client, "/uc/openapi/accountStatus", apiKey=KEY))["code"] == 0
        assert (await call(client, "/uc/openapi/accountStatus"))["code"] == 301
        assert (await call(client, "/uc/openapi/accountStatus", apikey="bad"))["code"] == 802


async def test_invalid_creates_are_refused_with_business_codes() -> None:
    async with emulator(api_keys={KEY}, workflow_ids={"1904"}) as client:
        path = "/task/openapi/create"
        cases = [
            ({"workflowId": "1904"}, 301),  # no apiKey
            ({"apiKey": KEY}, 301),  # neither workflowId nor workflow
            ({"apiKey": KEY, "workflowId": "1904", "instanceType": "huge"}, 301),
            ({"apiKey": "wrong", "workflowId": "1904"}, 802),
            ({"apiKey": KEY, "workflowId": "1"}, 380),
            ({"apiKey": KEY, "workflowId": "1904", "nodeInfoList": [{"nodeId": "6"}]}, 803),
            ({"apiKey": KEY, "workflow": "{not json"}, 433),
        ]
        for body, code in cases:
            assert (await call(client, path, **body))["code"] == code, body
        garbage = await client.post(path, content=b"{oops", headers={"content-type": "x"})
        assert (garbage.status_code, garbage.json()["code"]) == (200, 301)
        workflow = json.dumps({"9": {"class_type": "SaveImage", "inputs": {}}})
        assert (await call(client, path, apiKey=KEY, workflow=workflow))["code"] == 0
        assert (await client.get("/_emulator/stats")).json()["created"] == 1


async def test_webhook_is_retried_after_failures() -> None:
    options = {"duration_s": 0, "webhook_backoff_s": 0.01}
    async with receiver(fail_first=2) as (recorder, hook), emulator(**options) as client:
        await create(client, webhookUrl=hook)
        hits = await recorder.wait_for(3)
        assert len({hit.body for hit in hits}) == 1

        async def stats() -> Any:
            return (await client.get("/_emulator/stats")).json()

        await until(stats, lambda s: s["webhooks_delivered"] == 1)


async def test_webhook_gives_up_after_three_retries() -> None:
    options = {"duration_s": 0, "webhook_backoff_s": 0.01}
    async with receiver(fail_first=99) as (recorder, hook), emulator(**options) as client:
        await create(client, webhookUrl=hook)
        await recorder.wait_for(4)

        async def stats() -> Any:
            return (await client.get("/_emulator/stats")).json()

        await until(stats, lambda s: s["webhooks_failed"] == 1)
        assert len(recorder.received) == 4


async def test_adapter_requests_round_trip() -> None:
    async with receiver() as (recorder, hook), emulator(max_concurrent=1, duration_s=0.5) as client:
        adapter = RunningHubAdapter(str(client.base_url))
        task = Task("t1", "comfyui", "img", "b1", {"workflowId": "1904", "nodeInfoList": NODES})
        submitted = await send(client, adapter.submit_request(task, KEY, hook))
        accepted = adapter.parse_submit(*submitted)
        assert isinstance(accepted, Accepted)
        task.remote_id = accepted.remote_id

        assert isinstance(
            adapter.parse_submit(*await send(client, adapter.submit_request(task, KEY, ""))), Full
        )
        refused = adapter.parse_submit(*await send(client, adapter.submit_request(task, "", "")))
        assert refused == Rejected("RH_301", "PARAMS_INVALID")

        async def query() -> Any:
            return adapter.parse_query(*await send(client, adapter.query_request(task, KEY)))

        assert await query() == Pending("RUNNING")
        result = await until(query, lambda outcome: not isinstance(outcome, Pending))
        assert isinstance(result, Succeeded)
        [hit] = await recorder.wait_for(1)
        assert adapter.parse_result(hit.json()) == result
        assert isinstance(result.data["data"][0]["taskCostTime"], int)


async def test_adapter_cancel_round_trip() -> None:
    async with emulator(duration_s=30) as client:
        adapter = RunningHubAdapter(str(client.base_url))
        task = Task("t1", "comfyui", "img", "b1", {"workflowId": "1904"})
        submitted = await send(client, adapter.submit_request(task, KEY, ""))
        accepted = adapter.parse_submit(*submitted)
        assert isinstance(accepted, Accepted)
        task.remote_id = accepted.remote_id
        cancel = adapter.cancel_request(task, KEY)
        assert cancel is not None
        assert (await send(client, cancel))[1]["code"] == 0
        outcome = adapter.parse_query(*await send(client, adapter.query_request(task, KEY)))
        assert isinstance(outcome, Failed)
        assert outcome.code == "RH_805"
        task.remote_id = "1"
        query = await send(client, adapter.query_request(task, KEY))
        assert isinstance(adapter.parse_query(*query), NotFound)


async def test_finished_tasks_are_forgotten_after_retention() -> None:
    async with emulator(duration_s=0, retention_s=0) as client:
        first = {"apiKey": KEY, "taskId": (await create(client))["data"]["taskId"]}

        async def outputs() -> Any:
            return await call(client, "/task/openapi/outputs", **first)

        await until(outputs, lambda answer: answer["code"] == 0)
        await create(client)  # its end sweeps out the first task
        await until(outputs, lambda answer: answer["code"] == 807)


async def test_webhook_poster_handles_chunks_closes_and_stale_connections() -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy",
        b"HTTP/1.1 204 No Content\r\n\r\n",  # then the server drops the connection
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nbody to the end",
    ]
    targets: list[bytes] = []
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while answers:
            head = await reader.readuntil(b"\r\n\r\n")
            targets.append(head.split(b" ")[1])
            length = re.search(rb"Content-Length: (\d+)", head)
            assert length is not None
            await reader.readexactly(int(length[1]))
            answer = answers.pop(0)
            writer.write(answer)
            if b" 204 " in answer or b"Connection: close" in answer:
                break
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    poster = WebhookPoster(timeout_s=2)
    url = f"http://127.0.0.1:{port}/cb?sig=a%2Bb"
    try:
        assert [await poster.post(url, b"{}") for _ in range(4)] == [200, 503, 204, 200]
    finally:
        poster.close()
        server.close()
    assert connections == 2  # a new connection after the idle one was dropped
    assert set(targets) == {b"/cb?sig=a%2Bb"}


async def test_webhook_poster_times_out() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    poster = WebhookPoster(timeout_s=0.1)
    try:
        with pytest.raises(TimeoutError):
            await poster.post(f"http://127.0.0.1:{port}/", b"{}")
    finally:
        poster.close()
        server.close()


async def test_records_creates_by_our_task_and_attempt_cancels_and_the_peak() -> None:
    async with emulator(duration_s=30) as client:
        hook = "http://127.0.0.1:9/callback/all?t=task%201&a=2&s=abc"
        first = (await create(client, webhookUrl=hook))["data"]["taskId"]
        await create(client)  # no webhook: no task of ours
        await call(client, "/task/openapi/cancel", apiKey=KEY, taskId=first)
        await call(client, "/task/openapi/cancel", apiKey=KEY, taskId=first)  # ended by then
        records = (await client.get("/_emulator/records")).json()[KEY]
        assert [(c["task"], c["attempt"]) for c in records["creates"]] == [
            ("task 1", 2),
            ("", None),
        ]
        assert [(c["remote"], c["task"], c["live"]) for c in records["cancels"]] == [
            (first, "task 1", True),
            (first, "task 1", False),
        ]
        assert (records["peak"], records["current"]) == (2, 1)


async def test_faults_lose_a_create_reply_and_answer_status_queries_badly() -> None:
    async with emulator(duration_s=30) as client:
        faults = {"drop_create_replies": 1, "status_faults": ["5xx", "non_json", "unknown_code"]}
        assert (await client.post("/_emulator/faults", json=faults)).json()["drop_create_replies"]
        with pytest.raises(httpx.HTTPError):  # the task was created, its reply lost
            await create(client)
        assert len((await client.get("/_emulator/records")).json()[KEY]["creates"]) == 1
        query = {"apiKey": KEY, "taskId": "1"}
        bad = await client.post("/task/openapi/outputs", json=query)
        assert bad.status_code == 502
        html = await client.post("/task/openapi/outputs", json=query)
        assert html.status_code == 200 and not html.text.startswith("{")
        unknown = await client.post("/task/openapi/status", json=query)
        assert unknown.json()["code"] == 9999
        assert (await client.post("/task/openapi/status", json=query)).json()["code"] == 807


async def test_a_slow_cancel_ends_the_task_later() -> None:
    async with emulator(duration_s=30) as client:
        await client.post("/_emulator/faults", json={"cancel_delay_s": 0.3})
        task_id = (await create(client))["data"]["taskId"]
        assert (await call(client, "/task/openapi/cancel", apiKey=KEY, taskId=task_id))["code"] == 0
        status = await call(client, "/task/openapi/status", apiKey=KEY, taskId=task_id)
        assert status["data"] == "RUNNING"  # acknowledged, not ended yet
        ended = await until(
            lambda: call(client, "/task/openapi/status", apiKey=KEY, taskId=task_id),
            lambda s: s["data"] == "FAILED",
        )
        assert ended["code"] == 0


@contextlib.contextmanager
def emulator_process(*options: str) -> Iterator[str]:
    """``aigcq emulate runninghub OPTIONS`` as a user runs it; its base URL."""
    port = reserved_port()
    args = [sys.executable, "-m", "aigcq", "emulate", "runninghub", "--port", str(port)]
    proc = subprocess.Popen([*args, *options], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/_emulator/stats", timeout=30)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)


def created_code(base: str, workflow_id: str) -> int:
    body = {"apiKey": KEY, "workflowId": workflow_id, "nodeInfoList": []}
    return int(httpx.post(f"{base}/task/openapi/create", json=body, timeout=5).json()["code"])


@pytest.mark.parametrize(
    ("options", "known", "unknown"),
    [
        ((), ["1"], ["1904", "no-such-workflow"]),  # the README's workflow id
        (("--workflow-id", "1904", "--workflow-id", "demo"), ["1904", "demo"], ["1"]),
        (("--any-workflow",), ["1", "1904", "no-such-workflow"], []),
    ],
)
def test_the_command_knows_the_workflows_it_was_given_and_refuses_the_others(
    options: tuple[str, ...], known: list[str], unknown: list[str]
) -> None:
    """RunningHub answers 380 WORKFLOW_NOT_EXISTS for a workflow id that does not exist;
    the emulator a user runs knows the ids it was given (`--workflow-id`, default 1)."""
    with emulator_process(*options) as base:
        assert [created_code(base, w) for w in known] == [0] * len(known)
        assert [created_code(base, w) for w in unknown] == [380] * len(unknown)
