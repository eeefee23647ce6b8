"""A Go client written for the original Go service (``tests/asynch/go``, standard library
only) against a real ``aigcq asynch`` process configured by a Go-style ``config.yml``
(issue 30 items 1 and 2). Skipped where ``go`` is not on PATH; CI installs it."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from tests.fakes.asynch import Served
from tests.fakes.processes import reserved_port, start_asynch, stop

GO = shutil.which("go")
SOURCE = Path(__file__).parent / "go"
pytestmark = pytest.mark.skipif(
    GO is None, reason="go is not on PATH (Debian: apt-get install golang-go; CI installs it)"
)


@pytest.fixture(scope="session")
def go_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The client, built offline with the standard library only."""
    assert GO is not None
    work = tmp_path_factory.mktemp("go")
    binary = work / "asynchgo"
    env = {
        **os.environ,
        "GOCACHE": str(work / "cache"),
        "GOPATH": str(work / "path"),
        "GOFLAGS": "-mod=mod",
        "GOPROXY": "off",
        "GOTOOLCHAIN": "local",
    }
    if not (shutil.which("cc") or shutil.which("gcc")):
        # Go 1.19 links its cgo-built net package with a C compiler, or rebuilds it without
        env["CGO_ENABLED"] = "0"
    built = subprocess.run(
        [GO, "build", "-o", str(binary), "."],
        cwd=SOURCE, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    return binary


async def test_a_go_client_of_the_original_service_works_unchanged(
    go_client: Path,
    pg_url: str,
    db: psycopg.AsyncConnection[Any],
    redis_url: str,
    redis: aioredis.Redis,
    model_emu: Served,
    tmp_path: Path,
) -> None:
    # As the Go service was configured: ":port" is every interface, so the client reaches
    # it on a loopback address other than 127.0.0.1 (a server bound to 127.0.0.1 refuses).
    # The Go service had no admin token: its callers send none, so the switching checklist's
    # AIGCQ_ASYNCH_ADMIN_OPEN=true opens the management routes for them.
    port = reserved_port()
    config = tmp_path / "config.yml"
    config.write_text(f'server:\n  address: ":{port}"\n')
    log = tmp_path / "asynch.log"
    proc, _ = start_asynch(
        pg_url, redis_url, tmp_path / "data", log=log, port=port,
        AIGCQ_ASYNCH_CONFIG=str(config), AIGCQ_ASYNCH_WORKER_INTERVAL_SECONDS="0.2",
        AIGCQ_ASYNCH_ADMIN_TOKEN="", AIGCQ_ASYNCH_ADMIN_OPEN="true",
    )  # fmt: skip
    try:
        client = await asyncio.create_subprocess_exec(
            str(go_client), "-base", f"http://127.0.0.2:{port}", "-model", model_emu.url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(client.communicate(), 120)
    finally:
        stop(proc)
    transcript = out.decode()
    assert client.returncode == 0, transcript + "\n--- asynch log ---\n" + log.read_text()[-3000:]
    assert transcript.rstrip().endswith("all steps passed")
