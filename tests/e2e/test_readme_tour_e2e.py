"""The README's quick tour, pasted in order into a fresh folder, from the state its first
command leaves (``aigcq up`` running in the first terminal), gets its result.

The tour's blocks run as written, in ``bash``, and its SDK example in ``python``; only the
fixed ports are moved to free ones (the tour's 9101, the SDK's 8087, and the server's
8087/8089 through the environment both terminals share).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.processes import reserved_port, wait_http

README = Path(__file__).resolve().parents[2] / "README.md"


def tour_blocks(language: str = "bash") -> list[str]:
    """The ``language`` blocks of the README's "Quick tour" section, in order."""
    text = README.read_text()
    section = text.split("## Quick tour", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


class Terminal:
    """A process group started in the folder (its background jobs die with it)."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder, self.env = folder, env
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            args, cwd=self.folder, env=self.env, stdout=log.open("ab"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def paste(self, block: str, log: Path) -> str:
        """Run ``block`` as pasted (bash, stopping at the first failure); its output."""
        proc = self.start(["bash", "-e", "-c", block], log)
        assert proc.wait(120) == 0, log.read_text()
        return log.read_text()

    def close(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for proc in self.procs:
            proc.wait(20)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    folder = tmp_path / "clone"
    folder.mkdir()
    (folder / ".venv").symlink_to(sys.prefix)  # what the first command created
    ports = {"AIGCQ_WS_PORT": str(reserved_port()), "AIGCQ_CALLBACK_PORT": str(reserved_port())}
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("AIGCQ_", "REDIS_"))}
    path = f"{Path(sys.executable).parent}:{keep.get('PATH', '')}"
    term = Terminal(folder, {**keep, **ports, "PATH": path})
    try:
        yield term
    finally:
        term.close()


def test_quick_tour_as_pasted_gets_its_result(terminal: Terminal, tmp_path: Path) -> None:
    blocks = tour_blocks()
    assert len(blocks) == 2, blocks
    setup, client = blocks
    emulator_port = str(reserved_port())
    setup = setup.replace("9101", emulator_port)
    port = terminal.env["AIGCQ_WS_PORT"]
    up = terminal.start(["aigcq", "up"], tmp_path / "up-1.log")  # the first command's end
    wait_http(f"http://127.0.0.1:{port}/healthz")

    terminal.paste(setup, tmp_path / "setup.log")
    up.send_signal(signal.SIGINT)  # "stop it (Ctrl-C) and start it again"
    assert up.wait(20) == 0, (tmp_path / "up-1.log").read_text()
    terminal.start(["aigcq", "up"], tmp_path / "up-2.log")
    wait_http(f"http://127.0.0.1:{port}/healthz")
    wait_http(f"http://127.0.0.1:{emulator_port}/_emulator/stats")
    banner = (tmp_path / "up-2.log").read_text()
    assert "platforms  aigcq/comfyui" in banner and "secrets.json" in banner, banner
    assert f"http://127.0.0.1:{port}/dashboard (its admin token" in banner, banner  # every start
    assert "#token=" not in banner, banner  # a log file is no terminal: no secret in it

    out = terminal.paste(client, tmp_path / "client.log")
    assert '"status": "success"' in out, out
    assert "task tour-1: success" in out, out  # the timeline
    assert out.count('{"task_id": ') == 3, out  # three tasks' results, a JSON line each
    assert "tasks 1–4 of 4" in out, out  # the operator's list, with the server's admin token

    [sdk] = tour_blocks("python")  # pasted into `python` in the same terminal
    sdk = sdk.replace("127.0.0.1:8087", f"127.0.0.1:{port}")
    [export] = [line for line in client.splitlines() if "export AIGCQ_CLIENT_TOKEN=" in line]
    python = f"{export}\npython - <<'EOF'\n{sdk}EOF\n"  # a terminal keeps its exports
    out = terminal.paste(python, tmp_path / "sdk.log")
    assert re.search(r"^success \{'code': 0, .*'data': \[\{'fileUrl': 'http", out, re.M), out
