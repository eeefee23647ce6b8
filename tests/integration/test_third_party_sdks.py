"""Unchanged third-party clients from PyPI against aigcq: ``runninghub-sdk`` against the
message-dispatcher's RunningHub-compatible routes (as a business backend of the original
system would use it) and against the RunningHub emulator; ``cozepy`` against the Coze
emulator, from a venv of its own (``.venv-cozepy``: its pins would downgrade websockets and
httpx here). The emulators must answer these clients exactly as the real services do."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from aigcq.emulators.coze import CozeEmulatorConfig
from aigcq.emulators.coze import create_app as create_coze_app
from aigcq.emulators.runninghub import RunningHubEmulatorConfig, create_app
from tests.fakes.bridge import Bridge
from tests.fakes.message_dispatcher import BODY, Md, md  # noqa: F401 (md: a fixture)
from tests.fakes.servers import serve_app

runninghub_sdk = pytest.importorskip("runninghub_sdk")
ROOT = Path(__file__).resolve().parents[2]
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


async def test_runninghub_sdk_reads_account_and_queue_status_with_ghost_tasks() -> None:
    """Issue 28 item 1: the account-status and v2 queue-status calls as the SDK makes them,
    with tasks the platform counts that no create made (the emulator's ghosts)."""
    config = RunningHubEmulatorConfig(duration_s=0.1, api_keys={"sdk-key"}, remain_coins=500)
    async with serve_app(create_app(config)) as base:
        async with httpx.AsyncClient() as http:
            await http.post(f"{base}/_emulator/faults", json={"ghost_tasks": 2})
        client = runninghub_sdk.RunningHubClient(api_key="sdk-key", base_url=base, timeout=10)
        try:
            account = await asyncio.to_thread(client.get_account_status)
            assert (account.current_task_counts, account.remain_coins) == ("2", "500")
            assert account.api_type == "NORMAL"
            queue = await asyncio.to_thread(client.get_queue_status)
            assert (queue.concurrent_limit, queue.running_count, queue.queued_count) == (
                config.max_concurrent,
                "2",
                "0",
            )
        finally:
            client.close()


def cozepy_python() -> Path:
    """The interpreter of the venv that holds cozepy (``scripts/vendor-venvs`` makes it)."""
    python = ROOT / ".venv-cozepy" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no {python}: scripts/vendor-venvs makes it (scripts/check runs it)")
    return python


async def test_cozepy_against_the_coze_emulator() -> None:
    python = cozepy_python()
    config = CozeEmulatorConfig(duration_s=0.1, tokens={"pat_sdk"})
    async with serve_app(create_coze_app(config)) as base:
        proc = await asyncio.create_subprocess_exec(
            python, str(ROOT / "tests" / "vendor_clients" / "coze_walk.py"), base,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    seen = orjson.loads(out)
    assert seen["executeId"] and seen["status"] == "Success", seen
    assert "a cat" in seen["output"] and "a dog" in seen["syncData"], seen
    assert seen["wrongTokenRaised"], seen  # a CozeAPIError
