"""No secret in a log line or in ``/metrics`` (issue 42 item 13): ``aigcq up`` started as a
service is (its output to a file) names where its tokens are, never their values, at its
first start (it generates them) and at the next; on a terminal its banner shows the
dashboard link with the admin token, as the README says."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
from websockets.sync.client import connect

from aigcq.plumbing.auth import issue_client_token
from tests.fakes.processes import Proc, reserved_port, wait_http


def _env(tmp_path: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("AIGCQ_", "REDIS_"))}
    ports = {"AIGCQ_WS_PORT": str(reserved_port()), "AIGCQ_CALLBACK_PORT": str(reserved_port())}
    return {**keep, **ports, "AIGCQ_DATA_DIR": str(tmp_path / "data")}


def _secrets(tmp_path: Path) -> list[str]:
    kept: dict[str, str] = orjson.loads((tmp_path / "data" / "secrets.json").read_bytes())
    assert {"admin_token", "token_secret", "bridge_token"} <= set(kept), kept
    return list(kept.values())


def test_up_logs_no_secret_and_metrics_show_none(tmp_path: Path) -> None:
    env = _env(tmp_path)
    port = env["AIGCQ_WS_PORT"]
    for start in (1, 2):  # the first start generates the secrets, the next reads them
        log = tmp_path / f"up-{start}.log"
        up = Proc(["up"], env, log).start()
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz")
            secret = orjson.loads((tmp_path / "data" / "secrets.json").read_bytes())
            client = issue_client_token(secret["token_secret"], "c1")
            with connect(f"ws://127.0.0.1:{port}/?token={client}&id=c1") as ws:
                ws.send('{"type": "ping"}')  # a client in: uvicorn logs its URL
                assert "pong" in str(ws.recv(timeout=10))
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        finally:
            up.stop()
        text = log.read_text()
        assert "dashboard  http://" in text and "secrets.json" in text, text
        assert '"WebSocket /?token=***&id=c1" [accepted]' in text, text
        for value in [*_secrets(tmp_path), client]:
            assert value not in text, (start, text)
            assert value not in metrics, start
    assert "generated admin_token (kept in" in (tmp_path / "up-1.log").read_text()


def test_on_a_terminal_the_banner_links_the_dashboard_with_its_token(tmp_path: Path) -> None:
    env = _env(tmp_path)
    port = env["AIGCQ_WS_PORT"]
    main, terminal = pty.openpty()
    with (tmp_path / "up.log").open("ab") as errors:
        up = subprocess.Popen(
            [sys.executable, "-m", "aigcq", "up"], env=env, stdout=terminal, stderr=errors
        )
    os.close(terminal)
    shown = b""
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        deadline = time.monotonic() + 10
        while b"secrets" not in shown and time.monotonic() < deadline:
            if select.select([main], [], [], 0.5)[0]:
                shown += os.read(main, 65536)
    finally:
        up.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            up.wait(10)
        up.kill()
        os.close(main)
    admin = orjson.loads((tmp_path / "data" / "secrets.json").read_bytes())["admin_token"]
    assert f"/dashboard#token={admin}".encode() in shown, shown
