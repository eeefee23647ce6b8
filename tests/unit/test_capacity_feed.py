"""Instance numbering and INSTANCE_* events of the capacity feed (seed 000 §7.5)."""

from __future__ import annotations

import orjson

from aigcq.bridges.registry import Assignment, BridgeConn
from aigcq.bridges.slots import SlotLedger
from aigcq.dispatcher.capacity import Instance, InstanceBook, instance_events
from aigcq.mdclient.feed import feed_url


async def _nothing(_text: str) -> None:
    return None


def _bridge(count: int, free: int, running: set[str] | None = None) -> BridgeConn:
    slots = SlotLedger(count, free)
    for task_id in sorted(running or ()):
        slots.adopt(task_id, 1)
    return BridgeConn("b", _nothing, slots)


def _statuses(instances: list[Instance]) -> list[tuple[str, str | None]]:
    return [(i.status, i.task_id) for i in instances]


def test_a_task_keeps_its_instance_while_it_runs() -> None:
    book = InstanceBook()
    first = {i.task_id: i.instance_id for i in book.instances([_bridge(3, 1, {"t1", "t2"})])}
    assert first[None] == "b#2"  # the free one
    after = {i.task_id: i.instance_id for i in book.instances([_bridge(3, 2, {"t2"})])}
    assert after["t2"] == first["t2"]


def test_unknown_use_pending_tasks_and_quarantine() -> None:
    book = InstanceBook()
    conn = _bridge(3, 0)
    conn.pending["t1"] = Assignment(1, "a", "comfyui")  # a slot the bridge counted busy
    assert _statuses(book.instances([conn])) == [("busy", "t1"), ("busy", None), ("busy", None)]
    conn.set_state(quarantined_at=1.0)
    assert [s for s, _ in _statuses(book.instances([conn]))] == ["busy", "offline", "offline"]


def _kinds(old: list[Instance], new: list[Instance]) -> list[tuple[str, dict[str, object]]]:
    events = instance_events({i.instance_id: i for i in old}, {i.instance_id: i for i in new})
    return [(m["type"], m["data"]) for m in map(orjson.loads, events)]


def test_events_of_each_transition() -> None:
    online, busy = Instance("b", "b#0", "online"), Instance("b", "b#0", "busy", "t1")
    assert [k for k, _ in _kinds([], [busy])] == ["INSTANCE_ONLINE", "INSTANCE_BUSY"]
    assert _kinds([online], [busy])[0][1]["taskId"] == "t1"
    ((kind, data),) = _kinds([busy], [online])
    assert kind == "INSTANCE_IDLE" and data["completedTaskId"] == "t1"
    ((kind, data),) = _kinds([online], [])
    assert kind == "INSTANCE_OFFLINE" and data["reason"] == "disconnected"
    ((kind, data),) = _kinds([online], [Instance("b", "b#0", "offline")])
    assert kind == "INSTANCE_OFFLINE" and data["reason"] == "out of rotation"
    assert _kinds([online], [online]) == []


def test_feed_url() -> None:
    assert feed_url("http://h:4000/") == "ws://h:4000/ws/capacity"
    assert feed_url("https://md.example") == "wss://md.example/ws/capacity"
