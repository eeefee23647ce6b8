"""The e2e tests' fixture: a ``Cluster`` (tests/fakes/processes.py) on a private Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from aigcq.embedded.redis import EmbeddedRedis
from tests.fakes.processes import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    redis = EmbeddedRedis(tmp_path / "redis", persist=True)
    c = Cluster(tmp_path, redis.start())
    try:
        yield c
    finally:
        c.close()
        redis.stop()
