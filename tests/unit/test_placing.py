"""Placing tasks on free instances (issue 24, item 3): the matching, what the lookahead
claims, and each bridge's free instances as the hub counts them."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aigcq.bridges.conn import BridgeConn
from aigcq.bridges.lookahead import Candidate, Reach, Rules, choose
from aigcq.bridges.placing import Matching, Slot
from aigcq.bridges.slots import Assignment
from aigcq.wire.bridge import InstanceInfo
from aigcq.wire.capabilities import Needs, fits

BASIC = Needs(frozenset({"EmptyImage", "SaveImage"}))
SPECIAL = Needs(frozenset({"EmptyImage", "ImageInvert", "SaveImage"}))
FULL = Needs(SPECIAL.node_classes | {"VAEDecode"})


def _slots(*offers: Needs | None) -> list[Slot]:
    return [Slot(f"bridge{i}", f"i{i}", offer) for i, offer in enumerate(offers)]


def _placed(slots: list[Slot], needs: list[Needs | None]) -> list[str | None]:
    matching = Matching(slots)
    for n in needs:
        matching.add(n)
    return [s.instance_id if s else None for s in matching.spots()]


def test_a_basic_task_takes_the_narrowest_instance_that_fits() -> None:
    assert _placed(_slots(FULL, BASIC), [BASIC, SPECIAL]) == ["i1", "i0"]
    assert _placed(_slots(None, BASIC), [BASIC]) == ["i1"]  # not known: widest, last


def test_a_task_placed_earlier_moves_to_make_room_but_is_never_dropped() -> None:
    ab = Needs(frozenset({"a", "b"}))
    ac = Needs(frozenset({"a", "c"}))
    a, b = Needs(frozenset({"a"})), Needs(frozenset({"b"}))
    # "a" takes the first of two equally wide kinds, then moves for "b"
    assert _placed(_slots(ab, ac), [a, b]) == ["i1", "i0"]
    # two basic tasks on two slots: the special one behind them waits
    assert _placed(_slots(FULL, BASIC), [BASIC, BASIC, SPECIAL]) == ["i1", "i0", None]
    assert _placed(_slots(BASIC), [SPECIAL, BASIC]) == [None, "i0"]


def test_unknown_needs_run_anywhere() -> None:
    assert _placed(_slots(BASIC), [None]) == ["i0"]


def test_spots_skip_slots_not_allowed_and_take_a_preferred_one_first() -> None:
    slots = [Slot("x", "i0", BASIC), Slot("y", "i1", BASIC), Slot("z", "i2", BASIC)]
    matching = Matching(slots)
    matching.add(BASIC)
    matching.add(BASIC)
    spots = matching.spots(
        allowed=lambda task, slot: not (task == 0 and slot.owner == "x"),
        prefer=lambda task, slot: task == 0 and slot.owner == "z",
    )
    assert [s.owner if s else None for s in spots] == ["z", "x"]
    assert [s.owner if s else None for s in matching.spots()] == ["x", "y"]


_NODES = ["a", "b", "c"]
_needs = st.frozensets(st.sampled_from(_NODES), min_size=1).map(Needs)


@settings(max_examples=300, deadline=None)
@given(offers=st.lists(_needs, max_size=4), needs=st.lists(_needs, max_size=6))
def test_each_task_is_placed_iff_it_fits_with_those_placed_before_it(
    offers: list[Needs], needs: list[Needs]
) -> None:
    """The definition, by brute force: in queue order, a task is placed when it and every
    task placed before it can all have a slot that fits them."""
    placed: list[Needs] = []
    expected = []
    for n in needs:
        ok = _feasible([*placed, n], offers)
        expected.append(ok)
        if ok:
            placed.append(n)
    slots = _slots(*offers)
    matching = Matching(slots)
    assert [matching.add(n) for n in needs] == expected
    spots = matching.spots()
    assert [s is not None for s in spots] == expected
    used = [s.instance_id for s in spots if s is not None]
    assert len(used) == len(set(used))  # one task per slot
    for n, s in zip(needs, spots, strict=True):
        assert s is None or fits(s.offer, n)


def _feasible(needs: list[Needs], offers: list[Needs]) -> bool:
    return any(
        all(fits(offers[i], n) for i, n in zip(chosen, needs, strict=True))
        for chosen in itertools.permutations(range(len(offers)), len(needs))
    )


# ---- what the lookahead claims ------------------------------------------------------


def _rules(**changes: Any) -> Rules:
    values: dict[str, Any] = {
        "n": 1,
        "paid_free": None,
        "overflow_after_s": 0.0,
        "no_capable_wait_s": 60.0,
    }
    return Rules(**(values | changes))


def _queue(special: Reach = Reach.BUSY, **special_: Any) -> list[Candidate]:
    return [
        Candidate("special", SPECIAL, special, **({"waited_s": 1.0} | special_)),
        *(Candidate(f"b{i}", BASIC, Reach.BUSY, waited_s=1.0) for i in range(8)),
    ]


def test_a_task_no_free_instance_can_run_does_not_hold_back_those_behind_it() -> None:
    """Its only instance busy: the basic task behind it takes the free basic instance; it
    keeps its place (not claimed), and nothing is due later (a free slot wakes it)."""
    chosen = choose(_queue(), _slots(BASIC), _rules())
    assert chosen == (["b0"], None)
    assert choose(_queue(), _slots(BASIC, BASIC), _rules(n=2)).ids == ["b0", "b1"]
    assert choose(_queue(), _slots(FULL), _rules()).ids == ["special"]  # FIFO when it fits


def test_a_task_whose_instance_is_busy_goes_paid_only_for_a_slot_it_could_not_fill() -> None:
    """With a paid platform: handed back when one of the ``n`` slots counted for the
    queue is left (the rest overflow from the head as planned), once it has waited
    ``overflow_after``."""
    alone = [Candidate("special", SPECIAL, Reach.BUSY, waited_s=1.0)]
    assert choose(alone, _slots(BASIC), _rules(paid_free=3)).ids == ["special"]
    assert choose(alone, _slots(), _rules(n=0, paid_free=3)).ids == []
    assert choose(_queue(), _slots(BASIC), _rules(paid_free=3)).ids == ["b0"]
    young = choose(alone, _slots(BASIC), _rules(paid_free=3, overflow_after_s=5.0))
    assert young == ([], 4.0)


def test_a_task_only_an_offline_instance_could_run_waits_then_fails_or_goes_paid() -> None:
    waiting = choose(_queue(Reach.OFFLINE, offline_s=20.0), _slots(BASIC), _rules())
    assert waiting == (["b0"], 40.0)
    over = _queue(Reach.OFFLINE, offline_s=60.0)
    assert choose(over, _slots(BASIC), _rules()).ids == ["special", "b0"]  # to fail
    assert choose(over, _slots(), _rules(n=0)).ids == ["special"]  # whatever is free
    # a paid platform serves the queue: it never fails, it goes there (with room)
    assert choose(over, _slots(), _rules(n=0, paid_free=0)).ids == []
    young = _queue(Reach.OFFLINE, offline_s=1.0)
    assert choose(young[:1], _slots(BASIC), _rules(paid_free=1)).ids == ["special"]


def test_a_task_no_instance_of_the_cluster_could_run_is_handed_back_at_once() -> None:
    nowhere = _queue(Reach.NOWHERE)
    assert choose(nowhere, _slots(BASIC), _rules()).ids == ["special", "b0"]
    assert choose(nowhere[:1], _slots(BASIC), _rules(paid_free=1)).ids == ["special"]


def test_a_task_only_another_process_bridge_can_run_is_left_to_it() -> None:
    """That process claims it; to the paid platform after ELSEWHERE_WAIT_S, never failed."""
    elsewhere = _queue(Reach.ELSEWHERE)[:1]
    assert choose(elsewhere, _slots(BASIC), _rules(paid_free=1)) == ([], 4.0)
    assert choose(elsewhere, _slots(BASIC), _rules()) == ([], None)


# ---- a bridge's free instances ------------------------------------------------------


async def _nothing(_text: str) -> None:
    return None


def _info(instance_id: str, state: str, task: str | None = None, **extra: Any) -> InstanceInfo:
    offer = {"nodeClasses": sorted(extra.pop("offer", BASIC).node_classes), "models": []}
    return InstanceInfo.model_validate(
        {"instanceId": instance_id, "url": "http://x", "state": state, "taskId": task}
        | offer
        | extra
    )


def _conn(*instances: InstanceInfo) -> BridgeConn:
    conn = BridgeConn("b", _nothing)
    free = sum(1 for i in instances if i.state == "idle")
    conn.report(len(instances), free, held=[i.task_id for i in instances if i.task_id])
    conn.describe(list(instances))
    return conn


def test_free_instances_are_those_idle_and_not_placed_on_since() -> None:
    conn = _conn(_info("a", "busy", "t1", offer=SPECIAL), _info("b", "idle"), _info("c", "offline"))
    assert conn.free_instances() == {BASIC: ["b"]}  # a runs t1 (not ours), c is offline
    conn = _conn(_info("a", "idle", offer=SPECIAL), _info("b", "idle"), _info("c", "offline"))
    assert conn.free_instances() == {SPECIAL: ["a"], BASIC: ["b"]}
    assert conn.take("t2", Assignment(1, "p", "comfyui"), "b")
    assert conn.free_instances() == {SPECIAL: ["a"]}
    conn.ack("t2")
    # a report built after the ACK shows where it runs: it now counts, not the placing
    conn.report(3, 1, ["t2"], [_info("a", "idle", offer=SPECIAL), _info("b", "busy", "t2")])
    assert conn.placed == {}
    assert conn.free_instances() == {SPECIAL: ["a"]}
    conn.end("t2")
    # a report built before that end cannot undo it
    conn.report(3, 1, ["t2"], [_info("a", "idle", offer=SPECIAL), _info("b", "busy", "t2")])
    assert conn.free_instances() == {SPECIAL: ["a"], BASIC: ["b"]}


def test_an_offline_instances_offer_is_withdrawn_until_it_is_back() -> None:
    conn = _conn(_info("a", "offline", offer=SPECIAL), _info("b", "idle"))
    assert not conn.can_run(SPECIAL) and conn.could_run(SPECIAL) and conn.can_run(BASIC)
    conn.describe([_info("a", "idle", offer=SPECIAL), _info("b", "idle")])
    assert conn.can_run(SPECIAL) and not conn.could_run(SPECIAL)
    conn.describe([_info("a", "offline", offer=SPECIAL)])
    assert conn.offers == () and not conn.can_run(BASIC)


def test_an_instance_with_two_slots_takes_two_tasks() -> None:
    conn = _conn(_info("a", "idle", slots=2))
    conn.report(2, 2)
    assert conn.free_instances() == {BASIC: ["a", "a"]}


def test_a_bridge_that_does_not_describe_its_instances_runs_anything_on_its_free_slots() -> None:
    conn = BridgeConn("seed", _nothing)
    conn.report(2, 2)
    assert conn.free_instances() == {None: ["", ""]}
