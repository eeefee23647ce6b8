"""A port already in use: every ``aigcq`` process says so in one line naming the port and the
setting that moves it, before printing where it listens (and before starting anything)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aigcq.cli.app import app
from tests.fakes.cli import one_error_line
from tests.fakes.servers import bound_socket


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("AIGCQ_HOST", "AIGCQ_WS_PORT", "AIGCQ_CALLBACK_PORT", "AIGCQ_BRIDGE_PORT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def taken() -> Iterator[int]:
    """A port on 127.0.0.1 another program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def command(taken: int, other: int) -> list[tuple[list[str], dict[str, str], str]]:
    """(arguments, environment, the setting the error names) of every listening command."""
    redis = {"AIGCQ_REDIS_URL": "redis://127.0.0.1:1/0"}
    emulators = ["comfyui", "runninghub", "coze", "jimuai", "model-service", "oss", "prompts-core"]
    return [
        (["up"], {"AIGCQ_WS_PORT": str(taken)}, "AIGCQ_WS_PORT"),
        (["up"], {"AIGCQ_WS_PORT": str(other), "AIGCQ_CALLBACK_PORT": str(taken)},
         "AIGCQ_CALLBACK_PORT"),
        (["up", "--demo"], {"AIGCQ_WS_PORT": str(taken)}, "AIGCQ_WS_PORT"),
        (["up", "--demo"], {"AIGCQ_WS_PORT": str(other), "AIGCQ_CALLBACK_PORT": str(other),
                            "AIGCQ_DEMO_RUNNINGHUB_PORT": str(taken)},
         "AIGCQ_DEMO_RUNNINGHUB_PORT"),
        (["up", "--demo"], {"AIGCQ_WS_PORT": str(other), "AIGCQ_CALLBACK_PORT": str(other),
                            "AIGCQ_DEMO_JIMUAI_PORT": str(taken)},
         "AIGCQ_DEMO_JIMUAI_PORT"),
        (["serve"], {**redis, "TOKEN_SECRET": "s" * 32, "AIGCQ_WS_PORT": str(taken)},
         "AIGCQ_WS_PORT"),
        (["dispatcher"], {"AIGCQ_MD_PORT": str(taken)}, "AIGCQ_MD_PORT"),
        (["bridge", "--port", str(taken)], {}, "--port or AIGCQ_BRIDGE_HTTP_PORT"),
        (["asynch", "serve", "--port", str(taken)], {}, "--port or AIGCQ_ASYNCH_PORT"),
        *((["emulate", name, "--port", str(taken)], {}, "--port") for name in emulators),
    ]  # fmt: skip


def test_every_process_names_the_busy_port_and_its_setting(taken: int, tmp_path: Path) -> None:
    # reserved for the test (bound with SO_REUSEADDR, never listening), as a process's
    # own check binds it: free to that check, and no parallel test can take it meanwhile
    with bound_socket() as free:
        other = free.getsockname()[1]
        for args, env, setting in command(taken, other):
            result = CliRunner().invoke(app, args, env=env)
            line = one_error_line(result, 1)
            assert line == (
                f"error: cannot listen on 127.0.0.1:{taken}: already in use "
                f"(set {setting} to use another port)"
            ), args
            assert "listening" not in result.stdout and "aigcq demo" not in result.stdout, args
    assert not (tmp_path / ".aigcq" / "demo").exists()  # the demo started nothing
