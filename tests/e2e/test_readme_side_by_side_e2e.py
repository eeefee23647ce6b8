"""The README's two commands at once: its first, ``aigcq up`` on the default ports 8087 and
8089, keeps running while a part of its second (the suite) runs beside it — the part that
starts aigcq's own commands and servers. They share one network namespace of their own
(``unshare -n``, as root), so the ports taken are no one else's on this machine.

The whole suite holds the default ports anyway (``tests/fakes/default_ports.py``): this
test is the README's own sequence, with a real ``aigcq up`` on them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.side_by_side import ROOT, clean_env, own_network

pytestmark = pytest.mark.e2e

BESIDE = [
    "tests/unit/test_default_ports.py",
    "tests/unit/test_cli_ports.py",
    "tests/unit/test_cli_errors.py",
    "tests/unit/test_cli_token.py",
    "tests/unit/test_signing.py",
    "tests/unit/test_redis_address.py",
    "tests/integration/test_cli_server_errors.py",
    "tests/integration/test_client_sdk.py",
]


@pytest.mark.timeout(900)
def test_the_suite_runs_beside_aigcq_up_on_its_default_ports(tmp_path: Path) -> None:
    runner = [sys.executable, "-m", "tests.fakes.side_by_side", str(tmp_path), *BESIDE, "-x"]
    done = subprocess.run(
        [*own_network(), *runner], cwd=ROOT, env=clean_env(), capture_output=True, text=True,
        timeout=840,
    )  # fmt: skip
    up = (tmp_path / "up.log").read_text()
    assert "aigcq listening on 127.0.0.1:8087, 127.0.0.1:8089" in up, up
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-2000:]}\n{up[-2000:]}"
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-2000:]
