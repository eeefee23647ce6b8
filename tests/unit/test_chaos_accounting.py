"""``bench/chaos.py``'s accounting of what the client got (issue 25 item 2): a late success
after an ``UncertainSubmit`` failure is "paid, late success delivered", neither a duplicate
nor "paid, but the task failed"; two different results otherwise are a duplicate."""

from __future__ import annotations

from collections import Counter

from bench.chaos import Load, duplicated, paid_failed


async def load_with(*messages: dict[str, object]) -> Load:
    load = Load([], rate=1)
    sent: list[object] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    load._send = send  # type: ignore[method-assign]  # acks go nowhere
    for msg in messages:
        await load._on({"type": "result", **msg})
    return load


async def test_a_late_success_after_uncertain_submit_is_neither_a_duplicate_nor_a_loss() -> None:
    load = await load_with(
        {"taskId": "t1", "id": "1-0", "status": "failed", "code": "UncertainSubmit"},
        {"taskId": "t1", "id": "2-0", "status": "success", "late": True},
        {"taskId": "t1", "id": "2-0", "status": "success", "late": True},  # redelivered
    )
    runs = Counter({"t1": 1})
    assert load.late == {"t1"}
    assert paid_failed(runs, load) == []
    assert duplicated(load) == 0


async def test_a_failure_with_no_late_success_is_paid_but_failed() -> None:
    load = await load_with(
        {"taskId": "t2", "id": "1-0", "status": "failed", "code": "UncertainSubmit"},
        {"taskId": "t3", "id": "3-0", "status": "success"},
        {"taskId": "t3", "id": "4-0", "status": "success"},  # a second entry: a duplicate
    )
    assert paid_failed(Counter({"t2": 1, "t3": 1}), load) == ["t2"]
    assert duplicated(load) == 1
