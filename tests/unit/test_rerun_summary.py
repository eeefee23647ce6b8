"""``scripts/check`` ends with the tests that needed a rerun (``scripts/rerun-summary`` reads
the run's output): a rerun stays visible below the coverage table instead of scrolling away."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SUMMARY = Path(__file__).parents[2] / "scripts" / "rerun-summary"

RERUNS = ("--reruns", "2", "-rR", "test_sample.py")

FLAKY = """
from pathlib import Path

def test_flaky_once():
    marker = Path(__file__).with_name("ran-once")
    if not marker.exists():
        marker.write_text("")
        raise AssertionError("first run")

def test_always_fails():
    raise AssertionError("every run")

def test_steady():
    pass
"""


def _pytest_output(tmp_path: Path) -> str:
    (tmp_path / "test_sample.py").write_text(FLAKY)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *RERUNS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1, run.stdout + run.stderr  # test_always_fails
    return run.stdout


def test_the_last_lines_name_each_rerun_test_and_how_it_ended(tmp_path: Path) -> None:
    output = _pytest_output(tmp_path)
    summary = subprocess.run(
        [str(SUMMARY)], input=output, capture_output=True, text=True, check=True, timeout=30
    ).stdout
    lines = summary.strip().splitlines()
    assert "2 test(s) needed a rerun" in lines[0]
    assert lines[1:] == [
        "RERUN x1  test_sample.py::test_flaky_once  (passed on a rerun)",
        "RERUN x2  test_sample.py::test_always_fails  (failed every run)",
    ]


def test_a_run_without_reruns_adds_nothing() -> None:
    done = subprocess.run(
        [str(SUMMARY)], input="...\n3 passed in 0.1s\n", capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stdout) == (0, "")


def test_colours_of_a_terminal_are_read_through() -> None:
    coloured = "\x1b[33mRERUN\x1b[0m t.py::test_x\n\x1b[32mPASSED\x1b[0m t.py::test_x\n"
    summary = subprocess.run(
        [str(SUMMARY)], input=coloured, capture_output=True, text=True, check=True, timeout=30
    ).stdout
    assert summary.strip().splitlines()[1] == "RERUN x1  t.py::test_x  (passed on a rerun)"
