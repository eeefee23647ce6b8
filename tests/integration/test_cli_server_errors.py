"""The client commands against a real aigcq (and RunningHub emulator): what the server
refuses is one line with its code and message, and exit code 1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from click.testing import Result
from typer.testing import CliRunner

from aigcq.cli.app import app
from aigcq.emulators.runninghub import RunningHubEmulatorConfig
from aigcq.plumbing.auth import issue_client_token
from tests.fakes.service import service_with_runninghub

STATIC_TOKEN = "cli-static-token"
JWT = issue_client_token("t" * 32, "cli-jwt-backend")  # the secret service_with_runninghub uses
PAYLOAD = json.dumps({"workflowId": "1904136902449209346", "nodeInfoList": []})
MODELS = '{"proj": {"comfyui": {"apikey": "k", "concurrency": 5}}}'


@pytest.fixture
async def server(tmp_path: Path, redis: aioredis.Redis, redis_url: str) -> AsyncIterator[str]:
    """The base URL (``http://127.0.0.1:<port>``) of a running aigcq."""
    emulator = RunningHubEmulatorConfig(duration_s=0.1)
    async with service_with_runninghub(
        tmp_path, redis, redis_url, models=MODELS, emulator=emulator, token=STATIC_TOKEN
    ) as env:
        yield env.base


async def run(*args: str) -> Result:
    """The CLI in a thread: the server runs in this event loop."""
    return await asyncio.to_thread(CliRunner().invoke, app, list(args))


def error_line(result: Result) -> str:
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exc_info
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "command",
    [["status"], ["tasks", "show", "t1"], ["submit", "comfyui", PAYLOAD, "--aigc", "proj"]],
)
async def test_bad_token_prints_the_servers_code_and_message(
    server: str, command: list[str]
) -> None:
    line = error_line(await run(*command, "--server", server, "--token", "bad"))
    assert line.startswith("error: AuthError: 认证失败")
    assert "invalid or missing" in line


async def test_unknown_task_is_named(server: str) -> None:
    line = error_line(await run("tasks", "show", "nope", "--server", server, "--token", JWT))
    assert line.startswith("error: TaskNotFound: ")


async def test_submit_speaks_for_the_tokens_backend_and_shows_the_task(server: str) -> None:
    """submit's --backend-id defaults to the JWT's sub; tasks show prints the timeline."""
    args = ["--server", server, "--token", JWT]
    submitted = await run("submit", "comfyui", PAYLOAD, "--aigc", "proj", "--task-id", "c1", *args)
    assert submitted.exit_code == 0, submitted.output
    shown = await run("tasks", "show", "c1", *args)
    assert shown.exit_code == 0, shown.output
    assert "task c1: success (proj / comfyui)" in shown.stdout
    async with httpx.AsyncClient(base_url=server) as http:
        task = (await http.get("/api/tasks/c1", headers={"Authorization": f"Bearer {JWT}"})).json()
    assert task["backendId"] == "cli-jwt-backend"


async def test_unknown_platform_is_one_line(server: str) -> None:
    args = ["--server", server, "--token", JWT, "--aigc", "proj"]
    line = error_line(await run("submit", "nosuch", PAYLOAD, *args))
    assert line.startswith("error: PlatformError: "), line


async def test_a_result_prints_without_null_fields(server: str) -> None:
    args = ["--server", server, "--token", JWT, "--aigc", "proj", "--task-id", "n1"]
    submitted = await run("submit", "comfyui", PAYLOAD, *args)
    assert submitted.exit_code == 0, submitted.output
    result = json.loads(submitted.stdout)
    assert result["status"] == "success" and result["task_id"] == "n1", result
    assert None not in result.values() and "id" not in result, result


async def test_one_submit_takes_several_tasks(server: str) -> None:
    """Three payloads: three tasks over one connection, their results as JSON lines in
    order, a line each on stderr as they end (one display, not three)."""
    args = ["--server", server, "--token", JWT, "--aigc", "proj"]
    submitted = await run("submit", "comfyui", PAYLOAD, PAYLOAD, PAYLOAD, *args)
    assert submitted.exit_code == 0, submitted.output
    results = [json.loads(line) for line in submitted.stdout.splitlines()]
    assert [r["status"] for r in results] == ["success"] * 3
    ids = [r["task_id"] for r in results]
    assert len(set(ids)) == 3
    assert sorted(submitted.stderr.splitlines()) == sorted(f"{i}: success" for i in ids)


async def test_a_file_of_tasks_keeps_its_order_and_names_each_refusal(
    server: str, tmp_path: Path
) -> None:
    tasks = [
        {"platform": "comfyui", "payload": json.loads(PAYLOAD), "taskId": "j1"},
        {"platform": "nosuch", "payload": {}, "taskId": "j2"},
        {"platform": "comfyui", "payload": json.loads(PAYLOAD), "taskId": "j3", "AIGC": "proj"},
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in tasks) + "\n\n")
    result = await run("submit", "--file", str(path), "--aigc", "proj", "--server", server,
                       "--token", JWT)  # fmt: skip
    assert result.exit_code == 1  # not every task succeeded
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["task_id"], r["status"]) for r in lines] == [
        ("j1", "success"), ("j2", "refused"), ("j3", "success"),
    ]  # fmt: skip
    assert lines[1]["code"] == "PlatformError"
    assert "j2: refused: PlatformError: " in result.stderr


async def test_tasks_come_from_stdin(server: str) -> None:
    line = json.dumps({"platform": "comfyui", "payload": json.loads(PAYLOAD), "taskId": "s1"})
    argv = ["submit", "--file", "-", "--aigc", "proj", "--server", server, "--token", JWT]
    result = await asyncio.to_thread(CliRunner().invoke, app, argv, input=line + "\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["task_id"] == "s1"  # one task: its result as one document
