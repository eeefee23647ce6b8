"""The Coze emulator served for real, driven over HTTP and through the adapter."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from aigcq.domain import Task
from aigcq.emulators.coze import CozeEmulatorConfig, create_app
from aigcq.platforms.base import Accepted, Failed, NotFound, Pending, Rejected, Succeeded
from aigcq.platforms.coze import CozeAdapter
from tests.fakes.servers import send, serve_app
from tests.fakes.waiting import until

TOKEN = "pat_test"
WORKFLOW = "7428"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@contextlib.asynccontextmanager
async def emulator(**options: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A running emulator (runs last 0.3 s unless told) and an authorized client for it."""
    config = CozeEmulatorConfig(**{"duration_s": 0.3, "tokens": {TOKEN}, **options})
    async with (
        serve_app(create_app(config)) as base,
        httpx.AsyncClient(base_url=base, headers=AUTH) as client,
    ):
        yield client


async def run(client: httpx.AsyncClient, **body: Any) -> Any:
    body = {"workflow_id": WORKFLOW, "parameters": {"prompt": "a cat"}, "is_async": True, **body}
    response = await client.post("/v1/workflow/run", json=body)
    assert response.status_code == 200
    return response.json()


async def history(client: httpx.AsyncClient, execute_id: str, workflow: str = WORKFLOW) -> Any:
    response = await client.get(f"/v1/workflows/{workflow}/run_histories/{execute_id}")
    assert response.status_code == 200
    assert response.headers["x-tt-logid"] == response.json()["detail"]["logid"]
    return response.json()


async def test_async_run_moves_from_running_to_success() -> None:
    async with emulator() as client:
        started = await run(client)
        assert (started["code"], started["msg"]) == (0, "Success")
        execute_id = started["execute_id"]
        assert execute_id.isdigit()
        assert f"execute_id={execute_id}" in started["debug_url"]

        async def poll() -> Any:
            return await history(client, execute_id)

        first = await poll()
        assert (first["code"], first["msg"]) == (0, "")
        [record] = first["data"]
        assert record["execute_status"] == "Running"
        assert (record["run_mode"], record["connector_id"]) == (2, "1024")

        done = await until(poll, lambda h: h["data"][0]["execute_status"] != "Running")
        [record] = done["data"]
        assert (record["execute_status"], record["error_code"]) == ("Success", "")
        output = json.loads(record["output"])
        assert isinstance(output["Output"], str)  # double-encoded
        end_node = json.loads(output["Output"])
        assert end_node["parameters"] == {"prompt": "a cat"}
        image = await client.get(end_node["output"])
        assert image.content.startswith(b"\x89PNG")


async def test_sync_run_answers_with_data_as_a_json_string() -> None:
    async with emulator(duration_s=0.05) as client:
        answer = await run(client, is_async=False, parameters=json.dumps({"prompt": "x"}))
        assert answer["code"] == 0
        assert json.loads(answer["data"])["parameters"] == {"prompt": "x"}
        stats = (await client.get("/_emulator/stats")).json()
        assert (stats["runs"], stats["async_runs"]) == (1, 0)


async def test_failed_run_reports_fail_with_error_code_and_message() -> None:
    async with emulator(failure_rate=1.0, duration_s=0) as client:
        execute_id = (await run(client))["execute_id"]
        [record] = (await history(client, execute_id))["data"]
        assert record["execute_status"] == "Fail"
        assert record["error_code"] and record["error_message"]
        assert record["output"] == ""
        sync = await run(client, is_async=False)
        assert sync["code"] != 0 and sync["msg"]


async def test_errors_use_coze_codes() -> None:
    async with emulator(workflow_ids={WORKFLOW}) as client:
        execute_id = (await run(client))["execute_id"]
        assert (await run(client, workflow_id="other"))["code"] == 4200
        assert (await run(client, workflow_id=""))["code"] == 4000
        assert (await run(client, parameters="{not json"))["code"] == 4000
        assert (await history(client, "123"))["code"] == 4314
        assert (await history(client, execute_id, workflow="other"))["code"] == 4314
        for headers in ({"Authorization": "Bearer nope"}, {"Authorization": ""}):
            client.headers.update(headers)
            assert (await run(client))["code"] == 4100
            assert (await history(client, execute_id))["code"] == 4100


async def test_async_refused_when_not_allowed() -> None:
    async with emulator(allow_async=False) as client:
        assert (await run(client))["code"] == 6003


async def test_stats_count_runs_and_polls() -> None:
    async with emulator(duration_s=30) as client:
        execute_id = (await run(client))["execute_id"]
        for _ in range(3):
            await history(client, execute_id)
        stats = (await client.get("/_emulator/stats")).json()
        assert stats == {
            "runs": 1,
            "async_runs": 1,
            "polls": 3,
            "running": 1,
            "peak_concurrent": {"pat_test": 1},
        }


async def test_adapter_requests_round_trip() -> None:
    async with emulator() as client:
        adapter = CozeAdapter(str(client.base_url))
        payload = {"workflow_id": WORKFLOW, "parameters": {"prompt": "a cat"}, "bot_id": "9"}
        task = Task("t1", "coze", "chat", "b1", payload)
        submitted = await send(client, adapter.submit_request(task, TOKEN, ""))
        accepted = adapter.parse_submit(*submitted)
        assert isinstance(accepted, Accepted)
        task.remote_id = accepted.remote_id

        async def query() -> Any:
            return adapter.parse_query(*await send(client, adapter.query_request(task, TOKEN)))

        assert await query() == Pending("Running")
        result = await until(query, lambda outcome: not isinstance(outcome, Pending))
        assert isinstance(result, Succeeded)
        assert result.data["Output"]["parameters"] == {"prompt": "a cat"}

        refused = adapter.parse_submit(*await send(client, adapter.submit_request(task, "x", "")))
        assert isinstance(refused, Rejected) and refused.code == "COZE_4100"
        task.remote_id = "123"
        assert isinstance(await query(), NotFound)


async def test_adapter_sees_failures() -> None:
    async with emulator(failure_rate=1.0, duration_s=0) as client:
        adapter = CozeAdapter(str(client.base_url))
        task = Task("t1", "coze", "chat", "b1", {"workflow_id": WORKFLOW, "parameters": {}})
        submitted = await send(client, adapter.submit_request(task, TOKEN, ""))
        accepted = adapter.parse_submit(*submitted)
        assert isinstance(accepted, Accepted)
        task.remote_id = accepted.remote_id
        outcome = adapter.parse_query(*await send(client, adapter.query_request(task, TOKEN)))
        assert isinstance(outcome, Failed)
        assert outcome.code.isdigit() and outcome.message


async def test_finished_runs_are_forgotten_after_retention() -> None:
    async with emulator(duration_s=0, retention_s=0) as client:
        first = (await run(client))["execute_id"]
        assert (await history(client, first))["code"] == 0
        await run(client)  # starting a run sweeps out the finished ones
        assert (await history(client, first))["code"] == 4314


async def test_records_count_runs_until_they_end_and_faults_answer_history_badly() -> None:
    async with emulator(duration_s=0.3) as client:
        first = (await run(client))["execute_id"]
        await run(client)
        await client.post("/_emulator/faults", json={"status_faults": ["5xx"]})
        assert (
            await client.get(f"/v1/workflows/{WORKFLOW}/run_histories/{first}", headers=AUTH)
        ).status_code == 502
        records = (await client.get("/_emulator/records")).json()[TOKEN]
        assert records["creates"][0]["remote"] == first
        assert (records["peak"], records["current"]) == (2, 2)
        ended = await until(
            lambda: client.get("/_emulator/records"), lambda r: r.json()[TOKEN]["current"] == 0
        )
        assert ended.json()[TOKEN]["peak"] == 2
