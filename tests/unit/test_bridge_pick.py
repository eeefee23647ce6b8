"""The hub's choice of bridge (seed 000 §9.2.3): least-loaded first, then same bridge,
then random."""

from __future__ import annotations

from typing import Any

from aigcq.bridges.registry import BridgeConn, BridgeRegistry


async def _nothing(_text: str) -> None:
    return None


def _registry(*bridges: tuple[str, int, int]) -> BridgeRegistry:
    registry = BridgeRegistry(Any, "p", ttl_s=60)  # type: ignore[arg-type]  # never saved
    for bridge_id, count, free in bridges:
        registry.bridges[bridge_id] = BridgeConn(
            bridge_id, _nothing, instance_count=count, available=free
        )
    return registry


def _picked(registry: BridgeRegistry, workflow_id: str = "") -> str:
    conn = registry.pick(workflow_id)
    assert conn is not None
    return conn.bridge_id


def test_least_loaded_first_even_over_the_same_bridge() -> None:
    registry = _registry(("busy", 4, 1), ("idle", 4, 4))
    registry.last_bridge["wf"] = "busy"
    assert _picked(registry, "wf") == "idle"
    assert _registry(("none", 2, 0)).pick() is None


def test_ties_go_to_the_same_bridge_else_at_random() -> None:
    registry = _registry(("a", 2, 2), ("b", 2, 2), ("c", 2, 2))
    first = _picked(registry, "wf")
    assert {_picked(registry, "wf") for _ in range(20)} == {first}
    assert {_picked(registry) for _ in range(200)} == {"a", "b", "c"}
