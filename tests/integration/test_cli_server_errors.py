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
