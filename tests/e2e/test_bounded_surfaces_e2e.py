"""Every real HTTP / WebSocket surface is bounded (issue 25 item 9): ``aigcq serve``, the
message-dispatcher and the bridge's admin page, each a process with a 0.5 s head timeout
and a limit of 8 connections. A silent socket and a slowloris head are cut; a request over
the limit gets 503 naming the setting while the health probe is answered. (model-asynch:
``tests/asynch/test_bounded_asynch.py``.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.fakes.loris import BOUNDS, check_bounded
from tests.fakes.processes import Cluster, start_dispatcher


def _serve(c: Cluster) -> tuple[int, str]:
    return c.server(**BOUNDS)[1], "/healthz"


def _dispatcher(c: Cluster) -> tuple[int, str]:
    return start_dispatcher(c, **BOUNDS)[1], "/api/health"


def _bridge(c: Cluster) -> tuple[int, str]:
    """A bridge with no aigcq and no ComfyUI to reach (ports reserved, where nothing
    listens): its admin page serves all the same."""
    nobody = [f"http://127.0.0.1:{c.ports.take()}"]
    return c.bridge(c.ports.take(), nobody, **BOUNDS)[1], "/healthz"


@pytest.mark.parametrize("start", [_serve, _dispatcher, _bridge], ids=lambda f: f.__name__[1:])
def test_each_surface_cuts_idle_and_slow_connections_and_caps_them(
    cluster: Cluster, start: Callable[[Cluster], tuple[int, str]]
) -> None:
    port, probe = start(cluster)
    check_bounded(port, probe)
