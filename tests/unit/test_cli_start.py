"""``aigcq --help`` and the client commands start without the server's libraries: no
FastAPI, uvicorn, Redis or pydantic (nor pydantic-settings) is imported (each cost tens
of milliseconds of every start; bench/cli_start_bench.py measures the start itself).
Issue 29 item 6."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.servers import closed_port

SERVER_SIDE = {"fastapi", "starlette", "uvicorn", "redis", "pydantic", "aigcq.serve"}

#: run ``aigcq ARGS`` in this interpreter, then print the top-level modules it loaded
PROBE = """
import json, runpy, sys
sys.argv = ["aigcq", *sys.argv[1:]]
try:
    runpy.run_module("aigcq", run_name="__main__")
except SystemExit:
    pass
names = {m.split(".")[0] for m in sys.modules} | {m for m in sys.modules if m.startswith("aigcq.")}
print(json.dumps(sorted(names)), file=sys.stderr)
"""


def loaded(args: list[str], cwd: Path) -> set[str]:
    run = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    return set(json.loads(run.stderr.strip().splitlines()[-1]))


def test_help_loads_no_server_library(tmp_path: Path) -> None:
    modules = loaded(["--help"], tmp_path)
    assert not modules & SERVER_SIDE, modules & SERVER_SIDE


@pytest.mark.parametrize("args", [["--help"], ["tasks", "--help"], ["tasks", "list", "--bad"]])
def test_help_and_usage_errors_load_no_markdown_parser(args: list[str], tmp_path: Path) -> None:
    """typer's help imports rich.markdown (markdown_it) and rich.traceback (rich.pretty)
    for what aigcq never prints: about half of `aigcq --help`'s CPU (issue 41 §2)."""
    modules = loaded(args, tmp_path)
    assert "markdown_it" not in modules
    assert "typer" in modules  # it did print its help


def test_what_typer_defers_still_works_when_used() -> None:
    """A markdown text and a traceback, as typer would print them."""
    probe = (
        "from aigcq.cli import command_table; command_table.root()\n"
        "from rich.markdown import Markdown; from rich.console import Console\n"
        "from rich.traceback import Traceback\n"
        "Console(width=40).print(Markdown('# *deferred*'))\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n"
        "    Console(width=80).print(Traceback.from_exception(type(e), e, e.__traceback__))\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "deferred" in run.stdout and "ZeroDivisionError" in run.stdout


@pytest.mark.parametrize(
    "command",
    [
        ["tasks", "show", "t1"],
        ["tasks", "list"],
        ["tasks", "cancel", "t1"],
        ["bridges", "drain", "br1"],
        ["status"],
        ["submit", "comfyui", "{}"],
    ],
)
def test_client_commands_load_no_server_library(command: list[str], tmp_path: Path) -> None:
    """Against a server that refuses connections: the start and the one-line error."""
    with closed_port() as port:
        modules = loaded([*command, "--token", "t", "--server", f"127.0.0.1:{port}"], tmp_path)
    assert not modules & SERVER_SIDE, modules & SERVER_SIDE
    assert "cryptography" not in modules  # PyJWT's, to read a token's sub: not needed
    assert "httpx" not in modules  # the standard library's urllib is much lighter
    if command[0] != "submit":  # the SDK's WebSocket client is submit's alone
        assert "websockets" not in modules


def test_a_client_command_finds_the_default_server_without_the_settings(tmp_path: Path) -> None:
    """No ``--server``: where ``aigcq up`` listens is read from the environment and
    ``./.env`` by the tiny reader (aigcq.cli.client_env), not by pydantic-settings."""
    with closed_port() as port:
        (tmp_path / ".env").write_text(f"AIGCQ_WS_PORT={port}\n")
        modules = loaded(["status", "--token", "t"], tmp_path)
    assert not modules & SERVER_SIDE, modules & SERVER_SIDE


def test_the_command_modules_evaluate_their_annotations_once() -> None:
    """Typer reads every command's signature at each start: with ``from __future__ import
    annotations`` each annotation is a string it evaluates (twice) every time."""
    import importlib

    from aigcq.cli.command_table import LAZY

    modules = {"aigcq.cli.app", "aigcq.cli.entry", *(module for module, _, _ in LAZY.values())}
    for name in sorted(modules):
        assert "annotations" not in vars(importlib.import_module(name)), name
