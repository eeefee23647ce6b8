"""A slot freed on trust (a task told to stop on a bridge that does not say when its
instance is free) is stopping again while a report still lists the task (issue 42 item 9):
the refusal of the next task offered there says "still stopping", not "no capacity"."""

from __future__ import annotations

import time

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from aigcq.bridges.slots import Assignment, SlotLedger
from tests.unit.test_bridge_slots import TASKS, Ledger


class LedgerOnTrust(Ledger):
    """The ledger's state machine, with ends on trust among its moves: its invariants
    (counts add up, never negative, a slot freed once per take) hold all the same."""

    @rule(task_id=TASKS, attempt=st.none() | st.integers(1, 3))
    def end_on_trust(self, task_id: str, attempt: int | None) -> None:
        held = self.ledger.attempt_of(task_id)
        stopping_before = self.ledger.stopping.get(task_id, 0)
        ended = self.ledger.end(task_id, attempt, on_trust=True)
        assert ended == (held is not None and attempt in (None, held))
        if ended:
            self._gave_back(task_id)
            # its slot is free now: an earlier attempt of the same id may still be
            # stopping, this one is not added to it
            assert self.ledger.stopping.get(task_id, 0) == stopping_before


LedgerOnTrust.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_slot_ledger_with_ends_on_trust = LedgerOnTrust.TestCase


def running(ledger: SlotLedger, *ids: str) -> None:
    for task_id in ids:
        assert ledger.take(task_id, Assignment(1, "a", "comfyui"))
        assert ledger.ack(task_id) is not None


def test_a_refusal_still_listing_a_task_freed_on_trust_shows_it_stopping() -> None:
    ledger = SlotLedger(2, 2)
    running(ledger, "cancelled", "runs")
    assert ledger.end("cancelled", 1, on_trust=True)
    assert (ledger.free, ledger.stopped) == (1, 0)  # offered on trust
    assert ledger.take("next", Assignment(1, "a", "comfyui"))
    assert ledger.refuse("next", withhold=False) is not None
    ledger.report(2, 0, held=["cancelled", "runs"])  # the refusal's counts
    assert (ledger.free, ledger.stopped, ledger.withheld) == (0, 1, 0)
    ledger.report(2, 1, held=["runs"])  # its next HEARTBEAT: the prompt let go
    assert (ledger.free, ledger.stopped) == (1, 0)


def test_a_report_that_no_longer_lists_it_leaves_the_slot_free() -> None:
    ledger = SlotLedger(2, 2)
    running(ledger, "cancelled", "runs")
    assert ledger.end("cancelled", 1, on_trust=True)
    ledger.report(2, 1, held=["runs"])
    ledger.report(2, 0, held=["runs", "cancelled"])  # an older report: not stopping again
    assert ledger.stopped == 0


def test_a_task_ended_otherwise_is_not_stopping_when_listed() -> None:
    ledger = SlotLedger(2, 2)
    running(ledger, "done", "runs")
    assert ledger.end("done", 1)  # its TASK_END: the result is on its way, not stopping
    ledger.report(2, 1, held=["done", "runs"])
    assert (ledger.free, ledger.stopped) == (1, 0)


def test_an_earlier_attempt_still_stopping_is_not_freed_by_a_later_end_on_trust() -> None:
    ledger = SlotLedger(2, 2)
    running(ledger, "t0")
    assert ledger.end("t0", 1, stopping=True)  # cancelled on a bridge that reports it
    ledger.adopt("t0", 2)  # the bridge reconnects and still holds a newer attempt
    assert ledger.end("t0", 2, on_trust=True)
    assert ledger.stopping == {"t0": 1}  # the first attempt's instance is still stopping


def test_a_slot_stopping_for_long_is_no_longer_promised_as_about_to_be_free() -> None:
    ledger = SlotLedger(2, 2)
    running(ledger, "cancelled")
    assert ledger.end("cancelled", 1, stopping=True)
    now = time.monotonic()
    assert ledger.stopping_soon(10.0, now) == 1
    assert ledger.stopping_soon(10.0, now + 11) == 0  # the bridge never said it let go
    assert (ledger.stopped, ledger.free) == (1, 1)  # still busy all the same
    ledger.report(2, 2, held=[])
    assert ledger.stopping_soon(10.0, now) == 0
