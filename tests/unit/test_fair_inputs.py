"""The fair policy's inputs (issue 27): a submit's scheduling fields as validated and
stored, and a Redis window as the planner's :class:`Waiting` / :class:`Pool` /
:class:`Shares` (:mod:`aigcq.scheduler.fair`); by example and by property."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aigcq.config import ConfigError, PlatformConfig, ProjectShare, Settings
from aigcq.domain import Ordering
from aigcq.gateway.errors import ClientError
from aigcq.gateway.submission import parse_generate
from aigcq.queue.keys import Keys
from aigcq.queue.store import Window, Windowed
from aigcq.scheduler import fair
from aigcq.scheduler.policy import decayed, plan_round, time_left

NOW = 10_000.0
KEYS = Keys("t")


def message(**fields: Any) -> dict[str, Any]:
    return {"taskId": "t1", "platform": "comfyui", "payload": {}} | fields


def test_a_message_without_the_fields_parses_as_before() -> None:
    req = parse_generate(message())
    assert (req.priority, req.userId, req.maxWaitMs, req.keepWaiting) == (None,) * 4


def test_the_fields_parse() -> None:
    req = parse_generate(message(priority=30, userId="u-1", maxWaitMs=5000, keepWaiting=True))
    assert (req.priority, req.userId, req.maxWaitMs, req.keepWaiting) == (30, "u-1", 5000, True)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("priority", -1),
        ("priority", "10"),
        ("priority", float("inf")),
        ("userId", ""),
        ("userId", "u" * 129),
        ("userId", 7),
        ("maxWaitMs", -1),
        ("maxWaitMs", 1.5),
        ("maxWaitMs", True),
        ("maxWaitMs", 8 * 86400 * 1000),
        ("keepWaiting", "yes"),
        ("keepWaiting", 1),
    ],
)
def test_a_wrong_field_is_a_json_error_naming_it(field: str, value: Any) -> None:
    with pytest.raises(ClientError) as caught:
        parse_generate(message(**{field: value}))
    assert caught.value.code.value == "JSONError"
    assert field in caught.value.detail


def test_the_projects_bounds_and_defaults() -> None:
    settings = Settings(
        priority_max_s={"*": 60, "vip": 600, "none": 0}, max_wait_ms={"vip": 30_000}
    )
    assert (settings.priority_max("x"), settings.priority_max("vip")) == (60, 600)
    assert settings.priority_max("none") == 0
    assert settings.default_max_wait_s("vip") == 30.0
    assert settings.default_max_wait_s("x") is None
    assert Settings(priority_max_s={}).priority_max("x") == 0  # no "*": none allowed


@given(
    user=st.text(min_size=0, max_size=8),
    credit=st.floats(0, 1e4),
    wait=st.none() | st.floats(0, 1e6),
    keep=st.booleans(),
)
def test_an_ordering_stores_only_what_differs_from_the_default(
    user: str, credit: float, wait: float | None, keep: bool
) -> None:
    ordering = Ordering(user, credit, wait, keep)
    fields = ordering.fields(NOW)
    stored = dict(zip(fields[::2], fields[1::2], strict=True))
    assert ("userId" in stored) == bool(user)
    assert ("credit" in stored) == bool(credit)
    assert ("keepWaiting" in stored) == keep
    assert ("startBy" in stored) == (wait is not None)
    if wait is not None:
        assert float(stored["startBy"]) == NOW + wait == ordering.start_by(NOW)
    assert Ordering().fields(NOW) == []


def windowed(task_id: str, aigc: str = "p", user: str = "", **more: Any) -> Windowed:
    fields: dict[str, Any] = {
        "created": NOW - 10,
        "workflow_id": "wf",
        "credit_s": 0.0,
        "start_by": None,
        "keep_waiting": False,
    } | more
    return Windowed(aigc, "comfyui", task_id, user=user, **fields)


def window(tasks: list[Windowed], **more: Any) -> Window:
    fields: dict[str, Any] = {"busy": [], "runs": {}, "usage": {}, "users": {}} | more
    return Window(tasks, **fields)


def inputs(w: Window, free: int = 1, **settings: Any) -> fair.Inputs:
    s = Settings(**settings)
    return fair.inputs(
        w,
        free=free,
        free_elsewhere=0,
        settings=s,
        keys=KEYS,
        now=NOW,
    )


def test_a_windows_tasks_become_waiting_tasks() -> None:
    w = window(
        [
            windowed("a", user="u", credit_s=5.0, start_by=NOW + 5, keep_waiting=True),
            windowed("b", workflow_id="new"),
        ],
        runs={"wf": 4.0, "other": 8.0},
    )
    a, b = inputs(w).tasks
    assert (a.task_id, a.user, a.credit_s, a.start_by, a.keep_waiting) == (
        "a",
        "u",
        5.0,
        NOW + 5,
        True,
    )
    assert a.run_s == 4.0
    assert b.run_s == 6.0  # a workflow never run: the mean of the others'


def test_with_no_run_known_the_default_run_time_is_assumed() -> None:
    [task] = inputs(window([windowed("a")]), share_default_run_s=42).tasks
    assert task.run_s == 42


def test_the_pool_counts_the_time_left_of_each_busy_slot() -> None:
    w = window([windowed("a")], busy=[("wf", NOW - 3), ("wf", None)], runs={"wf": 10.0})
    pool = inputs(w, free=2).pool
    assert (pool.free, pool.free_elsewhere) == (2, 0)
    assert list(pool.busy_s) == [time_left(10.0, 3), time_left(10.0, 0)]


def test_an_instance_booting_is_a_slot_a_task_may_wait_for_instead_of_paying() -> None:
    """Issue 40: a task whose start deadline our one busy GPU would miss goes to the paid
    platform's room, unless an instance the capacity planner asked for registers in time."""
    w = window(
        [windowed("a", created=NOW, start_by=NOW + 30)],
        busy=[("wf", NOW)],
        runs={"wf": 120.0},
    )
    for booting, paid in (((), ["a"]), ((5.0,), [])):
        given = fair.inputs(w, free=0, free_elsewhere=0, settings=Settings(), keys=KEYS,
                            now=NOW, booting_s=booting)  # fmt: skip
        assert list(given.pool.busy_s)[1:] == list(booting)
        decision = plan_round(given.tasks, given.pool, given.shares, {("p", "comfyui"): 1},
                              NOW, fair.tuning(Settings()))  # fmt: skip
        assert decision.paid.get(("p", "comfyui"), []) == paid, booting


def test_the_shares_are_the_weights_and_the_usage_decayed_to_now() -> None:
    w = window(
        [windowed("a", aigc="p", user="u"), windowed("b", aigc="q")],
        usage={"t:usage:p": (100.0, NOW - 300), "t:usage:p:user:u": (50.0, NOW - 600)},
    )
    given_ = fair.inputs(
        w,
        free=1,
        free_elsewhere=0,
        settings=Settings(share_weights={"p": 2}, share_half_life_s=300),
        keys=KEYS,
        now=NOW,
    )
    shares = given_.shares
    assert shares.usage == {"p": decayed(100, 300, 300), "q": 0.0}
    assert shares.user_usage == {("p", "u"): decayed(50, 600, 300)}
    assert shares.norm("p") == pytest.approx(25.0)


@given(
    users=st.lists(st.sampled_from(["", "u", "v"]), min_size=1, max_size=12),
    running=st.dictionaries(st.sampled_from(["u", "v"]), st.integers(0, 4)),
    limit=st.integers(0, 3),
)
def test_a_users_tasks_beyond_its_limit_are_not_planned(
    users: list[str], running: dict[str, int], limit: int
) -> None:
    """Each user keeps at most what the limit leaves it, its earliest; no user, no limit."""
    tasks = [windowed(f"t{i}", user=u, created=NOW - 100 + i) for i, u in enumerate(users)]
    w = window(tasks, users={("p", u): n for u, n in running.items()})
    kept = inputs(w, user_max_running=limit).tasks
    if limit == 0:
        assert len(kept) == len(tasks)
        return
    for user in ("u", "v"):
        mine = [t.task_id for t in tasks if t.user == user]
        allowed = max(limit - running.get(user, 0), 0)
        assert [t.task_id for t in kept if t.user == user] == mine[:allowed]
    assert [t.task_id for t in kept if not t.user] == [t.task_id for t in tasks if not t.user]


def test_the_tuning_comes_from_the_settings() -> None:
    tuning = fair.tuning(
        Settings(share_lend_s=-1, share_patience=0.5, share_margin=0.1, overflow_after_ms=2500)
    )
    assert (tuning.lend_s, tuning.patience, tuning.margin, tuning.overflow_after_s) == (
        -1,
        0.5,
        0.1,
        2.5,
    )


def test_a_projects_ceiling_keeps_its_tasks_beyond_max_out_of_the_plan() -> None:
    """model.json ``share.max``: with 2 running and max 3, one more of its tasks is planned."""
    w = window(
        [windowed(f"p{i}", created=NOW - 10 + i) for i in range(4)] + [windowed("q0", aigc="q")],
        running={"p": 2},
    )
    given_ = fair.inputs(
        w, free=4, free_elsewhere=0, settings=Settings(), keys=KEYS, now=NOW,
        projects={"p": ProjectShare(max=3)},
    )  # fmt: skip
    assert [t.task_id for t in given_.tasks] == ["p0", "q0"]


def test_a_projects_minimum_puts_it_first_until_met() -> None:
    """model.json ``share.min``: a project owed GPUs goes before one with less usage."""
    w = window(
        [windowed("busy0", aigc="busy"), windowed("calm0", aigc="calm")],
        usage={"t:usage:busy": (500.0, NOW)},
        running={"busy": 1},
    )
    given_ = fair.inputs(
        w, free=1, free_elsewhere=0, settings=Settings(), keys=KEYS, now=NOW,
        projects={"busy": ProjectShare(min=2)},
    )  # fmt: skip
    assert given_.shares.owed == {"busy": 1}
    d = plan_round(given_.tasks, given_.pool, given_.shares, {}, NOW)
    assert d.internal == {("busy", "comfyui"): ["busy0"]}


@pytest.mark.parametrize(
    ("share", "field"),
    [
        ({"min": 3, "max": 2}, "p.share"),
        ({"min": -1}, "p.share.min"),
        ({"burst": 2}, "p.share.burst"),
    ],
)
def test_a_bad_share_is_refused_naming_the_field(
    tmp_path: Path, share: dict[str, int], field: str
) -> None:
    (tmp_path / "model.json").write_text(json.dumps({"p": {"share": share, "comfyui": {}}}))
    with pytest.raises(ConfigError, match=f"field '{field}'"):
        PlatformConfig.load(tmp_path)


def test_a_limited_users_task_with_a_deadline_is_held_for_its_paid_platform() -> None:
    """Issue 37 item 5: a user at its limit keeps its tasks off our GPUs, but one with a
    start deadline stays in the plan, held: once its safe start passes it goes to its paid
    platform (room 1) instead of expiring; one without a deadline just waits."""
    urgent = windowed("urgent", user="u", created=NOW - 20, start_by=NOW + 10)
    calm = windowed("calm", user="u", created=NOW - 30)
    w = window([calm, urgent], users={("p", "u"): 1})
    given_ = inputs(w, free=2, user_max_running=1)
    assert [(t.task_id, t.held) for t in given_.tasks] == [("urgent", True)]
    d = plan_round(given_.tasks, given_.pool, given_.shares, {("p", "comfyui"): 1}, NOW)
    assert d.paid == {("p", "comfyui"): ["urgent"]} and not d.internal


def test_minimums_above_the_fleet_are_named(tmp_path: Path) -> None:
    models = {"a": {"share": {"min": 3}, "comfyui": {}}, "b": {"share": {"min": 2}, "comfyui": {}}}
    (tmp_path / "model.json").write_text(json.dumps(models))
    config = PlatformConfig.load(tmp_path)
    assert config.minimums_beyond(0) == ""  # the fleet's size unknown: nothing to check
    assert config.minimums_beyond(5) == ""
    assert "'a.share.min' 3, 'b.share.min' 2" in config.minimums_beyond(4)
