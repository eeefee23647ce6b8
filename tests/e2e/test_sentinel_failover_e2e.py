"""Issue 26's failover run (tests/fakes/failover.py): a master, two replicas and three
sentinels, two ``aigcq serve`` processes with AIGCQ_REDIS_MIN_REPLICAS=1, a bridge in front
of an emulated ComfyUI and a recording RunningHub for the overflow; steady load from a
client on each process; SIGKILL the master in the middle of it. Nothing a client saw
acknowledged is lost, nothing is paid twice, and every result arrives once.
``bench/failover_bench.py`` prints the same run's figures, with MIN_REPLICAS 0 beside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes.failover import failover_run

pytestmark = pytest.mark.e2e


async def test_a_failover_under_load_loses_nothing_and_pays_nothing_twice(
    tmp_path: Path,
) -> None:
    report = await failover_run(tmp_path, min_replicas=1, rate=10.0, seconds=8.0)
    print("failover run:", json.dumps(report))
    assert report["acknowledged"] == 80
    assert report["acknowledged_then_lost"] == []
    assert report["double_paid"] == {}
    assert report["duplicates_delivered"] == {}
    assert report["dispatch_resumed_after_s"] is not None
    assert report["reconcile_passes"] == 2  # one per serve process
