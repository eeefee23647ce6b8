"""The README's first command, ``aigcq up`` on its default ports, and a part of the suite
beside it: run as ``python -m tests.fakes.side_by_side FOLDER PYTEST_ARGS...`` inside a
network namespace of its own (``unshare -n``), so the ports it takes are no one else's.

Brings the namespace's loopback up, starts ``aigcq up`` in FOLDER (its data in
FOLDER/.aigcq), waits until it answers on 127.0.0.1:8087, runs pytest with PYTEST_ARGS in
the repository, stops the server, and exits with pytest's status. :func:`own_network` is
the outer test's command prefix for such a namespace."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.processes import wait_http

ROOT = Path(__file__).resolve().parents[2]

#: what the developer's shell or the outer pytest sets that the two commands must not see
_PRIVATE = ("AIGCQ_", "TOKEN_SECRET", "CALLBACK_SECRET", "PYTEST_", "COV_CORE_")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_PRIVATE)}


def own_network() -> list[str]:
    """The command prefix for a network namespace of its own; skip where there is none."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` (iproute2) to bring a namespace's loopback up")
    try:
        done = subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no `unshare` (util-linux)")
    if done.returncode != 0:
        pytest.skip(f"unshare -n: {done.stderr.decode().strip()} (needs root)")
    return ["unshare", "-n"]


def main(folder: Path, pytest_args: list[str]) -> int:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    env = clean_env()
    with (folder / "up.log").open("ab") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "aigcq", "up"], cwd=folder, env=env, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_http("http://127.0.0.1:8087/healthz", timeout=90)
        tests = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
        return subprocess.run(tests, cwd=ROOT, env=env).returncode
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))
