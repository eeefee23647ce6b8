"""``aigcq up`` says "listening" when it does (issue 41 §2): it printed its banner before
starting Redis and the server, about 6 s before a client could connect."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.processes import reserved_port


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``aigcq up`` in a fresh folder, its stdout a pipe read line by line."""
    port = reserved_port()
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("AIGCQ_", "REDIS_"))}
    env = {**keep, "AIGCQ_WS_PORT": str(port), "AIGCQ_CALLBACK_PORT": str(reserved_port())}
    env["PYTHONUNBUFFERED"] = "1"  # each line as printed, as on a terminal
    proc = subprocess.Popen(
        [sys.executable, "-m", "aigcq", "up"], cwd=tmp_path, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield proc, port
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_banner_says_listening_once_a_client_can_connect(
    up: tuple[subprocess.Popen[str], int],
) -> None:
    proc, port = up
    assert proc.stdout is not None
    for line in proc.stdout:  # blocks until a line: the test's timeout bounds it
        if "listening on" in line:
            break
    else:
        pytest.fail(f"aigcq up exited ({proc.wait()}) without its banner")
    answer = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)  # at once
    assert answer.status_code == 200
