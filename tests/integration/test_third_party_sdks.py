"""Unchanged third-party clients from PyPI against aigcq: ``runninghub-sdk`` against the
message-dispatcher's RunningHub-compatible routes (as a business backend of the original
system would use it) and against the RunningHub emulator; ``cozepy`` against the Coze
emulator. The emulators must answer these clients exactly as the real services do."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import orjson
import pytest

from aigcq.emulators.coze import CozeEmulatorConfig
from aigcq.emulators.coze import create_app as create_coze_app
from aigcq.emulators.runninghub import RunningHubEmulatorConfig, create_app
from tests.fakes.bridge import Bridge
from tests.fakes.message_dispatcher import BODY, Md, md  # noqa: F401 (md: a fixture)
from tests.fakes.servers import serve_app
from tests.fakes.waiting import until

runninghub_sdk = pytest.importorskip("runninghub_sdk")
OUTPUT = {"fileUrl": "http://f/1.png", "fileType": "png", "taskCostTime": 3, "nodeId": "9"}


async def bridge_task_end(dispatcher: Md, webhook: str) -> None:
    """What ``aigcq bridge`` posts for a finished prompt (RunningHub's output items)."""
    event = {"code": 0, "msg": "success", "data": [OUTPUT]}
    body = {"event": "TASK_END", "taskId": "x", "eventData": orjson.dumps(event).decode()}
    parts = urlsplit(webhook)
    resp = await dispatcher.http.post(f"{parts.path}?{parts.query}", json=body)
    assert resp.status_code == 200, resp.text


async def test_runninghub_sdk_runs_a_task_through_the_dispatcher(md: Md) -> None:  # noqa: F811
    token = await md.token()
    client = runninghub_sdk.RunningHubClient(api_key=token, base_url=md.base, timeout=10)
    bridge = await Bridge.connect(md.port)
    await bridge.register(count=1)
    try:
        nodes = BODY["nodeInfoList"]
        created = await asyncio.to_thread(client.run, BODY["workflowId"], nodes)
        assert created.task_id and created.client_id, created
        account = await asyncio.to_thread(client.get_account_status)
        assert int(account.current_task_counts) == 1, account
        assign = await bridge.next()
        assert assign["data"]["taskId"] == created.task_id
        await bridge.ack(created.task_id)
        await bridge_task_end(md, assign["data"]["webhookUrl"])
        outputs = await asyncio.to_thread(
            client.wait_for_completion, created.task_id, poll_interval=0.1, timeout=10
        )
        assert [o.file_url for o in outputs] == ["http://f/1.png"]
    finally:
        client.close()
        await bridge.ws.close()


async def test_runninghub_sdk_against_the_runninghub_emulator() -> None:
    config = RunningHubEmulatorConfig(
        duration_s=0.1, api_keys={"sdk-key"}, consume_coins=12, consume_money=0.35
    )
    async with serve_app(create_app(config)) as base:
        client = runninghub_sdk.RunningHubClient(api_key="sdk-key", base_url=base, timeout=10)
        try:
            account = await asyncio.to_thread(client.get_account_status)
            assert int(account.current_task_counts) == 0, account
            created = await asyncio.to_thread(client.run, BODY["workflowId"], BODY["nodeInfoList"])
            assert created.task_id and created.client_id
            outputs = await asyncio.to_thread(
                client.wait_for_completion, created.task_id, poll_interval=0.1, timeout=10
            )
            assert outputs and outputs[0].file_url
            # what the task consumed, as the SDK reads it (issue 28 item 2)
            [output] = await asyncio.to_thread(client.get_outputs, created.task_id)
            assert (output.consume_coins, output.consume_money) == ("12", "0.35")
            assert output.third_party_consume_money is None and output.task_cost_time == "0"
        finally:
            client.close()


async def test_cozepy_against_the_coze_emulator() -> None:
    cozepy = pytest.importorskip("cozepy")
    config = CozeEmulatorConfig(duration_s=0.1, tokens={"pat_sdk"})
    async with serve_app(create_coze_app(config)) as base:
        coze = cozepy.AsyncCoze(auth=cozepy.AsyncTokenAuth("pat_sdk"), base_url=base)
        run = await coze.workflows.runs.create(
            workflow_id="7400000000000000001", parameters={"prompt": "a cat"}, is_async=True
        )
        assert run.execute_id
        history = await until(
            lambda: coze.workflows.runs.run_histories.retrieve(
                workflow_id="7400000000000000001", execute_id=run.execute_id
            ),
            lambda h: h.execute_status != cozepy.WorkflowExecuteStatus.RUNNING,
            within=10,
            interval=0.05,
        )
        assert history.execute_status == cozepy.WorkflowExecuteStatus.SUCCESS, history
        assert "a cat" in history.output
        done = await coze.workflows.runs.create(
            workflow_id="7400000000000000001", parameters={"prompt": "a dog"}
        )
        assert "a dog" in (done.data or "")
        with pytest.raises(cozepy.CozeAPIError):
            bad = cozepy.AsyncCoze(auth=cozepy.AsyncTokenAuth("wrong"), base_url=base)
            await bad.workflows.runs.create(workflow_id="7400000000000000001", parameters={})
