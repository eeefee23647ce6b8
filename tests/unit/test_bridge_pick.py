"""The hub's choice of bridge (seed 000 §9.2.3): least-loaded first, then same bridge,
then random. The indexed pick is checked against the plain O(n) definition."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aigcq.bridges.registry import BridgeConn, BridgeRegistry
from aigcq.bridges.slots import Assignment, SlotLedger
from aigcq.wire.capabilities import Needs


async def _nothing(_text: str) -> None:
    return None


def _registry(*bridges: tuple[str, int, int]) -> BridgeRegistry:
    registry = BridgeRegistry(Any, "p", ttl_s=60)  # type: ignore[arg-type]  # never saved
    for bridge_id, count, free in bridges:
        registry.bridges[bridge_id] = BridgeConn(bridge_id, _nothing, SlotLedger(count, free))
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


def test_ties_on_load_go_to_the_bridge_with_more_free_slots() -> None:
    registry = _registry(("small", 4, 2), ("large", 8, 4))  # both half loaded
    assert {_picked(registry) for _ in range(20)} == {"large"}


def _allowed(registry: BridgeRegistry, workflow_id: str) -> set[str]:
    """What ``pick`` may return, by the O(n) definition (empty: it must return None)."""
    candidates = [b for b in registry.bridges.values() if b.free() > 0]
    if not candidates:
        return set()
    best = min((b.load(), -b.free()) for b in candidates)
    tied = {b.bridge_id for b in candidates if (b.load(), -b.free()) == best}
    last = registry.last_bridge.get(workflow_id) if workflow_id else None
    return {last} if last in tied else tied


IDS = st.sampled_from(["a", "b", "c", "d", "e"])
OPS = st.one_of(
    st.tuples(st.just("add"), IDS, st.integers(0, 8), st.integers(0, 9)),
    st.tuples(st.just("remove"), IDS),
    st.tuples(st.just("set"), IDS, st.sampled_from(["online", "drained"]), st.booleans()),
    st.tuples(st.just("set"), IDS, st.just("quarantined_at"), st.sampled_from([None, 1.0])),
    st.tuples(st.just("reconcile"), IDS, st.integers(0, 8), st.integers(0, 9)),
    st.tuples(st.just("assign"), st.sampled_from(["", "wf1", "wf2"])),
    st.tuples(st.just("stale"), st.integers(-1, 9)),  # a replaced connection still changing
)


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=60))
def test_indexed_pick_matches_the_linear_definition(ops: list[tuple[Any, ...]]) -> None:
    registry = _registry()
    replaced: list[BridgeConn] = []
    for op in ops:
        kind, *args = op
        conn = registry.bridges.get(args[0]) if kind not in ("assign", "stale") else None
        if kind == "add":
            bridge_id, count, free = args
            if conn is not None:
                replaced.append(conn)
            registry.bridges[bridge_id] = BridgeConn(bridge_id, _nothing, SlotLedger(count, free))
        elif kind == "remove" and conn is not None:
            replaced.append(conn)
            del registry.bridges[conn.bridge_id]
        elif kind == "set" and conn is not None:
            conn.set_state(**{args[1]: args[2]})
        elif kind == "reconcile" and conn is not None:
            conn.report(args[1], args[2])
        elif kind == "stale" and replaced:
            replaced[-1].report(args[0], args[0])
            replaced[-1].set_state(online=True)
        elif kind == "assign":
            allowed = _allowed(registry, args[0])
            picked = registry.pick(args[0])
            if not allowed:
                assert picked is None
                continue
            assert picked is not None and picked.bridge_id in allowed
            assert picked is registry.bridges[picked.bridge_id]
            if args[0]:
                assert registry.last_bridge[args[0]] == picked.bridge_id
            assert picked.take(f"task{len(picked.pending)}", Assignment(1, "a", "comfyui"))
        assert registry.free_slots() == sum(b.free() for b in registry.bridges.values())
        least = registry._least_loaded()  # the bucket pick chooses from at random
        assert sorted(least.ids if least else []) == sorted(_allowed(registry, ""))
        anyone = registry.pick()  # after every step, without a workflow
        assert (anyone.bridge_id if anyone else None) in (_allowed(registry, "") or {None})


NEEDS = [None, Needs(frozenset({"L"}), frozenset({"a"})), Needs(frozenset({"L"}), frozenset({"b"}))]
OFFERS = st.sampled_from([None, (NEEDS[1],), (NEEDS[2],), (NEEDS[1], NEEDS[2])])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(IDS, st.integers(1, 4), st.integers(0, 4), OFFERS), max_size=6),
    st.lists(st.tuples(st.sampled_from(NEEDS), st.sampled_from(["", "wf1"])), max_size=20),
)
def test_a_pick_with_needs_is_the_least_loaded_bridge_that_can_run_them(
    bridges: list[tuple[str, int, int, Any]], picks: list[tuple[Needs | None, str]]
) -> None:
    registry = _registry()
    for bridge_id, count, free, offers in bridges:
        conn = BridgeConn(bridge_id, _nothing, SlotLedger(count, min(free, count)))
        conn.offers = offers
        registry.bridges[bridge_id] = conn
    for n, (needs, workflow_id) in enumerate(picks):
        capable = [b for b in registry.bridges.values() if needs is None or b.can_run(needs)]
        candidates = [b for b in capable if b.free() > 0]
        picked = registry.pick(workflow_id, needs)
        if not candidates:
            assert picked is None
            continue
        best = min((b.load(), -b.free()) for b in candidates)
        tied = {b.bridge_id for b in candidates if (b.load(), -b.free()) == best}
        assert picked is not None and picked.bridge_id in tied
        assert picked.take(f"t{n}", Assignment(1, "a", "comfyui"))
