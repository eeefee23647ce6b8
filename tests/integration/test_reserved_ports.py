"""Ports for child servers (``bench.processes.Ports``, ``reserved_port``): chosen without a
race. Picking a free port, closing it and handing its number to a child races with every
other test (xdist runs three at once) that binds port 0 or connects out meanwhile; a port
reserved (bound with SO_REUSEADDR, never listening, kept open) is handed to no one else,
while the child, binding it with SO_REUSEADDR too, listens there, and again after a restart.

The race is made certain in a network namespace of the test's own whose ephemeral range is
a single port (``tests/fakes/port_race.py``; as root, skipped elsewhere)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from bench.processes import Ports

from tests.fakes.side_by_side import ROOT, clean_env, own_network


def race(mode: str) -> dict[str, Any]:
    done = subprocess.run(
        [*own_network(), sys.executable, "-m", "tests.fakes.port_race", mode],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_probed_free_port_goes_to_whoever_binds_port_0_next() -> None:
    """The fault the reservations remove: the number handed over is someone else's."""
    seen = race("probe")
    assert seen["other"] == seen["port"]
    assert not seen["served"]


def test_a_reserved_port_is_no_one_elses_and_its_child_serves_there_across_a_restart() -> None:
    seen = race("reserve")
    assert seen["other"] is None  # the only ephemeral port is reserved: bind(0) is refused
    assert seen["served"] and seen["restarted"]


def test_ports_are_distinct_and_given_back_on_close() -> None:
    with Ports() as ports:
        taken = [ports.take() for _ in range(5)]
        assert len(set(taken)) == 5
    assert not ports._held
