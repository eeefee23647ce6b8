"""model-asynch's HTTP surface is bounded like every other (issue 25 item 9): the real
``aigcq asynch`` process with a 0.5 s head timeout and a limit of 8 connections cuts a
silent socket and a slowloris head, and answers 503 over the limit while ``/health`` is
answered (``tests/e2e/test_bounded_surfaces_e2e.py`` checks the other processes)."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.loris import BOUNDS, check_bounded
from tests.fakes.processes import start_asynch, stop


def test_asynch_cuts_idle_and_slow_connections_and_caps_them(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    proc, url = start_asynch(pg_url, redis_url, tmp_path, log=tmp_path / "asynch.log", **BOUNDS)
    try:
        check_bounded(int(url.rsplit(":", 1)[1]), "/health")
    finally:
        stop(proc)
