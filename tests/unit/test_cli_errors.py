"""The client commands (submit, status, tasks, bridges) fail with one line and an exit code.

No server is needed here: "server down" is a port bound on 127.0.0.1 that never listens.
The failures that need a server (a bad token, an unknown task) are in
tests/integration/test_cli_server_errors.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from aigcq.cli.app import app
from aigcq.cli.client import token_subject
from aigcq.cli.remote import server_url
from aigcq.plumbing.auth import issue_client_token
from tests.fakes.cli import one_error_line
from tests.fakes.servers import closed_port as refusing_port

PAYLOAD = '{"workflowId": "1"}'
CLIENT_COMMANDS = [["submit", "comfyui", PAYLOAD]]
#: the operator's: each finds the admin token the same way (a client token as --token too)
ADMIN_COMMANDS = [
    ["status"],
    ["tasks", "show", "t1"],
    ["tasks", "cancel", "t1"],
    ["tasks", "list"],
    ["tasks", "retry", "t1"],
    ["bridges", "drain", "br1"],
    ["bridges", "undrain", "br1"],
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AIGCQ_* setting nor .env of the developer's leaks in."""
    monkeypatch.chdir(tmp_path)
    for name in ("AIGCQ_CLIENT_TOKEN", "AIGCQ_ADMIN_TOKEN", "AIGCQ_HOST", "AIGCQ_WS_PORT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections (bound, so no one else takes it)."""
    with refusing_port() as port:
        yield port


def run(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("command", CLIENT_COMMANDS)
def test_no_token_names_the_option_and_the_variable(command: list[str], closed_port: int) -> None:
    line = one_error_line(run(*command, "--server", f"127.0.0.1:{closed_port}"), 2)
    assert line == (
        "error: no token: pass --token or set AIGCQ_CLIENT_TOKEN (`aigcq token ID` prints one)"
    )


@pytest.mark.parametrize("command", ADMIN_COMMANDS)
def test_no_admin_token_says_where_it_is(command: list[str], closed_port: int) -> None:
    line = one_error_line(run(*command, "--server", f"127.0.0.1:{closed_port}"), 2)
    assert line == (
        "error: no token: pass --token or set AIGCQ_ADMIN_TOKEN, or run this where `aigcq up` "
        "runs (.aigcq/secrets.json has no admin token)"
    )


@pytest.mark.parametrize("command", ADMIN_COMMANDS)
@pytest.mark.parametrize(
    ("where", "text"),
    [(".aigcq/secrets.json", '{"admin_token": "from-up"}'), (".env", "AIGCQ_ADMIN_TOKEN=x\n")],
)
def test_where_aigcq_up_runs_admin_commands_need_no_token(
    command: list[str], where: str, text: str, closed_port: int, tmp_path: Path
) -> None:
    (tmp_path / where).parent.mkdir(exist_ok=True)
    (tmp_path / where).write_text(text)
    line = one_error_line(run(*command, "--server", f"127.0.0.1:{closed_port}"), 1)
    assert "cannot reach the aigcq server" in line  # got past the token


@pytest.mark.parametrize("command", ADMIN_COMMANDS)
@pytest.mark.parametrize("variable", ["AIGCQ_ADMIN_TOKEN", "AIGCQ_CLIENT_TOKEN"])
def test_admin_commands_read_the_admin_token_first(
    command: list[str], variable: str, closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AIGCQ_ADMIN_TOKEN, else the server's, else AIGCQ_CLIENT_TOKEN (which may hold the
    admin token too)."""
    monkeypatch.setenv(variable, "t")
    line = one_error_line(run(*command, "--server", f"127.0.0.1:{closed_port}"), 1)
    assert "cannot reach the aigcq server" in line  # got past the token


@pytest.mark.parametrize("command", CLIENT_COMMANDS + ADMIN_COMMANDS)
def test_server_down_names_the_server(command: list[str], closed_port: int) -> None:
    result = run(*command, "--token", "t", "--server", f"http://127.0.0.1:{closed_port}")
    scheme = "ws" if command[0] == "submit" else "http"
    assert one_error_line(result, 1).startswith(
        f"error: cannot reach the aigcq server at {scheme}://127.0.0.1:{closed_port}: "
    )


@pytest.mark.parametrize("command", CLIENT_COMMANDS + ADMIN_COMMANDS)
def test_default_server_is_where_aigcq_up_listens(
    command: list[str], closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIGCQ_WS_PORT", str(closed_port))
    line = one_error_line(run(*command, "--token", "t"), 1)
    scheme = "ws" if command[0] == "submit" else "http"
    assert f" at {scheme}://127.0.0.1:{closed_port}/: " in line


def test_default_server_reads_dot_env(closed_port: int, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(f"AIGCQ_HOST=0.0.0.0\nAIGCQ_WS_PORT={closed_port}\n")
    line = one_error_line(run("status", "--token", "t"), 1)
    assert f" at http://127.0.0.1:{closed_port}/: " in line


def test_malformed_setting_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIGCQ_WS_PORT", "eighty")
    line = one_error_line(run("status", "--token", "t"), 2)
    assert line.startswith("error: configuration error: AIGCQ_WS_PORT: ")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("{bad json", "error: payload is not valid JSON: Expecting property name"),
        ("[1, 2]", "error: payload must be a JSON object, not list"),
        ("@/nonexistent/p.json", "error: cannot read payload file /nonexistent/p.json: No such"),
    ],
)
def test_bad_payload_is_named(payload: str, message: str, closed_port: int) -> None:
    server = f"ws://127.0.0.1:{closed_port}/"
    result = run("submit", "comfyui", payload, "--token", "t", "--server", server)
    assert one_error_line(result, 2).startswith(message)


def test_payload_from_file_is_read(closed_port: int, tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(PAYLOAD)
    server = f"ws://127.0.0.1:{closed_port}/"
    result = run("submit", "comfyui", "@p.json", "--token", "t", "--server", server)
    assert "cannot reach the aigcq server" in one_error_line(result, 1)  # got past the payload


def test_installed_command_prints_no_traceback(closed_port: int) -> None:
    """The real entry point (rich tracebacks and all), not only the test runner."""
    args = ["status", "--token", "t", "--server", f"http://127.0.0.1:{closed_port}"]
    proc = subprocess.run(
        [sys.executable, "-m", "aigcq", *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith("error: cannot reach the aigcq server at http://127.0.0.1:")
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("given", "scheme", "url"),
    [
        ("http://h:1", "ws", "ws://h:1"),
        ("ws://h:1/", "http", "http://h:1/"),
        ("https://h/x", "ws", "wss://h/x"),
        ("wss://h", "http", "https://h"),
        ("h:1", "ws", "ws://h:1"),
        ("ftp://h", "http", "ftp://h"),  # not ours to guess: the error names it
    ],
)
def test_server_url_takes_the_commands_scheme(given: str, scheme: str, url: str) -> None:
    assert server_url(given, scheme) == url


def test_default_server_url_brackets_ipv6(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIGCQ_HOST", "::")
    monkeypatch.setenv("AIGCQ_WS_PORT", "9000")
    assert server_url(None, "ws") == "ws://[::1]:9000/"


def test_submit_names_itself_after_the_tokens_subject() -> None:
    assert token_subject(issue_client_token("s" * 32, "my-backend")) == "my-backend"
    for not_a_jwt in ("a-static-token", "a.b.c", "a.!!!.c", "a.W10.c"):  # W10: "[]"
        assert token_subject(not_a_jwt) is None


def test_status_renders_a_split_servers_snapshot_without_health() -> None:
    from rich.console import Console

    from aigcq.cli.status import render

    console = Console(record=True, width=120)
    console.print(render({"health": None, "queues": [], "recent": []}))  # internal: dispatcher
    text = console.export_text()
    assert text.strip() and "internal" not in text  # no health table, and no TypeError


@pytest.mark.parametrize(
    ("args", "lines", "message"),
    [
        (["comfyui", PAYLOAD, "--file", "t.jsonl"], None, "error: give PLATFORM and PAYLOAD, or"),
        ([], None, "error: nothing to submit: give PLATFORM and PAYLOAD, or --file"),
        (["comfyui"], None, "error: nothing to submit: give PLATFORM and PAYLOAD, or --file"),
        (["comfyui", PAYLOAD, PAYLOAD, "--task-id", "x"], None, "error: --task-id names one task"),
        (["--file", "t.jsonl"], ['{"platform": "comfyui", "payload": {}}', "{bad"],
         "error: t.jsonl line 2: not JSON: "),
        (["--file", "t.jsonl"], ['{"platform": "comfyui"}'],
         "error: t.jsonl line 1: payload must be an object"),
        (["--file", "t.jsonl"], ['{"platform": 3, "payload": {}}'],
         "error: t.jsonl line 1: platform must be a string"),
        (["--file", "t.jsonl"], ['["comfyui"]'], "error: t.jsonl line 1: not a JSON object"),
        (["--file", "t.jsonl"],
         ['{"platform": "c", "payload": {}, "taskId": "a"}', "",
          '{"platform": "c", "payload": {}, "taskId": "a"}'],
         "error: t.jsonl line 3: taskId 'a' is line 1's too"),
        (["--file", "t.jsonl"], ["", "  "], "error: t.jsonl: no task in it"),
        (["--file", "missing.jsonl"], None, "error: cannot read missing.jsonl: No such file"),
    ],
)  # fmt: skip
def test_what_submit_takes_is_checked_before_anything_is_sent(
    args: list[str], lines: list[str] | None, message: str, closed_port: int, tmp_path: Path
) -> None:
    if lines is not None:
        (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    result = run("submit", *args, "--token", "t", "--server", f"127.0.0.1:{closed_port}")
    assert one_error_line(result, 2).startswith(message)  # exit 2: nothing was sent
