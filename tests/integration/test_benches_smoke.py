"""Every bench runs at its smoke size, so that none rots between the runs made by hand: each
``bench/*.py`` that is a bench (not one of the modules they share) is run as a child
process with ``--smoke`` (:mod:`bench.smoke`: a few tasks, one trial), and must exit 0
and print one JSON document. Nothing here reads a figure: no test asserts a time.

``bench/real_comfyui.py`` runs against two ComfyUI emulators of its own under ``--smoke``
(the CI machine has no real ComfyUI). The benches keep their temporary files where they
always do (a pytest ``tmp_path`` is too long a path for Redis's unix socket, and PostgreSQL
started by root cannot reach into it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: modules the benches share, not benches (``fleet_autoscale`` is ``fleet_sim --autoscale``,
#: run by tests/unit/test_fleet_autoscale.py)
SHARED = {"fleet", "fleet_autoscale", "front", "gpu_idle", "host", "processes", "smoke"}
BENCHES = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem not in SHARED)
#: run as a module, as its docstring says
AS_MODULE = {"real_comfyui"}
#: benches whose smoke run is a test of its own already
ELSEWHERE = {"fleet_sim": "tests/unit/test_fleet_sim.py"}


def command(name: str) -> list[str]:
    if name in AS_MODULE:
        return [sys.executable, "-m", f"bench.{name}"]
    return [sys.executable, str(ROOT / "bench" / f"{name}.py")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", [n for n in BENCHES if n not in ELSEWHERE])
def test_the_bench_runs_at_its_smoke_size_and_prints_json(name: str) -> None:
    # a session of its own: the servers a failed or stuck bench left behind are killed
    proc = subprocess.Popen(
        [*command(name), "--smoke"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=220)
    except subprocess.TimeoutExpired:
        stdout, stderr = "", f"{name} --smoke still running after 220 s"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-4000:]}"
    try:
        report = json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"not one JSON document: {done.stdout[-2000:]}") from None
    assert report, done.stdout


def test_every_bench_takes_smoke() -> None:
    """A new bench joins the smoke runs by itself: it must take ``--smoke``
    (``bench.smoke.parse_args``, or an option of its own as ``fleet_sim`` has)."""
    takes = ("smoke.parse_args", '"--smoke"', "bench.chaos import main, parse")
    missing = [
        n for n in BENCHES if not any(t in (ROOT / f"bench/{n}.py").read_text() for t in takes)
    ]
    assert not missing, f"benches without --smoke: {missing}"
