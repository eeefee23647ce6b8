"""A bridge's slot ledger: free + pending + running + withheld = instances, never negative,
a slot freed exactly once per task end — whatever the bridge and the queue say, in any order."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from aigcq.bridges.slots import Assignment, SlotLedger

TASKS = st.sampled_from([f"t{i}" for i in range(8)])
COUNTS = st.integers(0, 6)


class Ledger(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = SlotLedger()
        self.taken: dict[str, int] = {}  # task -> times its slot was taken
        self.freed: dict[str, int] = {}  # task -> times its slot was given back

    def _took(self, task_id: str) -> None:
        self.taken[task_id] = self.taken.get(task_id, 0) + 1

    def _gave_back(self, task_id: str) -> None:
        self.freed[task_id] = self.freed.get(task_id, 0) + 1

    @rule(
        instances=COUNTS,
        available=COUNTS,
        held=st.none() | st.sets(TASKS),
        busy_with=st.sets(TASKS),
    )
    def report(
        self, instances: int, available: int, held: set[str] | None, busy_with: set[str]
    ) -> None:
        running = dict(self.ledger.running)
        gone = self.ledger.report(instances, available, held, busy_with)
        if held is not None:  # a task being stopped that it no longer holds is let go
            assert not set(self.ledger.stopping) - held
        assert set(gone) == {t for t in running if t not in self.ledger.running}
        for task_id in gone:
            assert task_id in running and (held is None or task_id not in held)
            self._gave_back(task_id)

    @rule(task_id=TASKS, attempt=st.integers(1, 3))
    def take(self, task_id: str, attempt: int) -> None:
        free, held = self.ledger.free, self.ledger.holds(task_id)
        ok = self.ledger.take(task_id, Assignment(attempt, "a", "comfyui"))
        assert ok == (free > 0 and not held)
        if ok:
            self._took(task_id)
            assert self.ledger.free == free - 1

    @rule(task_id=TASKS)
    def ack(self, task_id: str) -> None:
        pending = task_id in self.ledger.pending
        free = self.ledger.free
        assert (self.ledger.ack(task_id) is not None) == pending
        assert self.ledger.free == free

    @rule(task_id=TASKS, withhold=st.booleans())
    def refuse(self, task_id: str, withhold: bool) -> None:
        free = self.ledger.free
        ledger = self.ledger
        over = ledger.instances - ledger.withheld + ledger.credited < ledger.used
        if self.ledger.refuse(task_id, withhold=withhold) is not None:
            self._gave_back(task_id)
            # a bare "no room": withheld until the next report; else free at once
            assert self.ledger.free == free + (0 if withhold or over else 1)

    @rule(task_id=TASKS)
    def release(self, task_id: str) -> None:
        if self.ledger.release(task_id) is not None:
            self._gave_back(task_id)

    @rule()
    def release_all(self) -> None:
        for task_id in self.ledger.release_all():
            self._gave_back(task_id)

    @rule(task_id=TASKS, attempt=st.none() | st.integers(1, 3), stopping=st.booleans())
    def end(self, task_id: str, attempt: int | None, stopping: bool) -> None:
        held = self.ledger.attempt_of(task_id)
        free = self.ledger.free
        ledger = self.ledger
        over = ledger.instances - ledger.withheld + ledger.credited < ledger.used
        credited = ledger.credited and task_id in ledger.running
        ended = ledger.end(task_id, attempt, stopping=stopping)
        assert ended == (held is not None and attempt in (None, held))
        if ended:
            self._gave_back(task_id)
            # being stopped: its slot stays taken until a report lets it go
            assert ledger.free == free + (0 if over or credited or stopping else 1)
            assert task_id in ledger.stopping or not stopping
            assert not self.ledger.end(task_id, attempt)  # once only

    @precondition(lambda self: bool(self.ledger.instances))
    @rule(task_id=TASKS, attempt=st.integers(1, 3))
    def adopt(self, task_id: str, attempt: int) -> None:
        if not self.ledger.holds(task_id):
            self.ledger.adopt(task_id, attempt)
            self._took(task_id)

    @invariant()
    def counts_add_up(self) -> None:
        ledger = self.ledger
        assert min(ledger.free, ledger.withheld, ledger.instances, ledger.credited) >= 0
        assert ledger.credited <= len(ledger.running) + ledger.stopped
        ours = ledger.used + ledger.withheld - ledger.credited
        assert ledger.free + ours == max(ledger.instances, ours)

    @invariant()
    def each_slot_freed_once_per_take(self) -> None:
        for task_id, times in self.freed.items():
            held = int(self.ledger.holds(task_id))
            assert times + held == self.taken.get(task_id, 0)


Ledger.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_slot_ledger = Ledger.TestCase


def test_a_heartbeat_racing_a_task_end_does_not_free_its_slot_twice() -> None:
    ledger = SlotLedger(1, 1)
    assert ledger.take("t", Assignment(1, "a", "comfyui"))
    assert ledger.ack("t") is not None
    ledger.report(1, 1)  # sent after the task ended, handled before its TASK_END
    assert ledger.free == 1
    assert ledger.end("t")
    assert ledger.free == 1
    assert not ledger.end("t")


def test_a_task_the_bridge_no_longer_holds_frees_its_slot() -> None:
    ledger = SlotLedger(1, 1)
    ledger.take("t", Assignment(1, "a", "comfyui"))
    ledger.ack("t")
    assert ledger.report(1, 1, held=[]) == ["t"]
    assert ledger.free == 1


def test_a_report_built_before_a_task_end_cannot_undo_it() -> None:
    """The bridge built its report while its instance still ran ``t``; the hub applied
    t's TASK_END first: the report's busy instance running ``t`` is free, not withheld."""
    ledger = SlotLedger(1, 1)
    ledger.take("t", Assignment(1, "a", "comfyui"))
    ledger.ack("t")
    assert ledger.end("t")
    ledger.report(1, 0, held=["t"], busy_with=["t"])
    assert (ledger.free, ledger.withheld) == (1, 0)
    ledger.report(1, 0, held=["x"], busy_with=["x"])  # someone else's: busy by its word
    assert (ledger.free, ledger.withheld) == (0, 1)


def test_a_refusal_that_says_nothing_about_capacity_withholds_nothing() -> None:
    ledger = SlotLedger(1, 1)
    ledger.take("t", Assignment(1, "a", "comfyui"))
    assert ledger.refuse("t", withhold=False) is not None
    assert (ledger.free, ledger.withheld) == (1, 0)
    ledger.take("u", Assignment(1, "a", "comfyui"))
    assert ledger.refuse("u") is not None  # a seed bridge's bare 421
    assert (ledger.free, ledger.withheld) == (0, 1)


def test_a_stopped_task_keeps_its_slot_until_the_bridge_lets_it_go() -> None:
    ledger = SlotLedger(1, 1)
    ledger.take("t", Assignment(1, "a", "comfyui"))
    ledger.ack("t")
    assert ledger.end("t", stopping=True)
    assert ledger.free == 0  # its instance is still stopping the prompt
    ledger.report(1, 0, held=["t"], busy_with=["t"])  # built before it stopped
    assert ledger.free == 0
    ledger.report(1, 1, held=[])
    assert (ledger.free, ledger.stopped) == (1, 0)
