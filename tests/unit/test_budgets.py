"""Issue 28 items 1 and 3 without a server: the spend periods in a configured time zone,
budgets in model.json (bad ones refused with the field named), the account status as
RunningHub answers it, and automatic holds as a dispatch round reads them."""

from __future__ import annotations

import calendar
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from aigcq.config import ConfigError, PlatformConfig, Settings
from aigcq.platforms.base import AccountState
from aigcq.platforms.runninghub import RunningHubAdapter
from aigcq.scheduler.pauses import Pause, Paused, PauseKind
from aigcq.scheduler.spend import period_names


def load(tmp_path: Path, models: dict[str, Any]) -> PlatformConfig:
    (tmp_path / "model.json").write_text(json.dumps(models))
    return PlatformConfig.load(tmp_path)


def test_a_period_is_the_day_and_month_of_the_configured_zone() -> None:
    new_year_shanghai = calendar.timegm((2026, 12, 31, 17, 0, 0))  # 01:00 on Jan 1st there
    assert period_names(new_year_shanghai) == {"day": "2026-12-31", "month": "2026-12"}
    shanghai = period_names(new_year_shanghai, "Asia/Shanghai")
    assert shanghai == {"day": "2027-01-01", "month": "2027-01"}


def test_an_unknown_zone_stops_the_start() -> None:
    with pytest.raises(ValidationError, match="AIGCQ_SPEND_TIMEZONE"):
        Settings(spend_timezone="Mars/Olympus")


def test_budgets_in_model_json_are_read_beside_the_platforms(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        {
            "proj": {
                "budget": {"day": 10, "month": 200, "on_limit": "fail"},
                "comfyui": {"apikey": "k", "budget": {"day": 5, "balance_floor": 1000}},
            }
        },
    )
    assert config.queues() == [("proj", "comfyui")]  # "budget" is no platform
    assert (config.budgets["proj"].day, config.budgets["proj"].on_limit) == (10, "fail")
    account = config.account("proj", "comfyui")
    assert account is not None and account.budget is not None
    assert (account.budget.day, account.budget.month, account.budget.balance_floor) == (
        5,
        None,
        1000,
    )


@pytest.mark.parametrize(
    ("models", "field"),
    [
        ({"proj": {"budget": {"dayly": 1}}}, "proj.budget.dayly"),
        ({"proj": {"budget": {"on_limit": "queue"}}}, "proj.budget.on_limit"),
        ({"proj": {"budget": {"month": -1}}}, "proj.budget.month"),
        ({"proj": {"comfyui": {"budget": {"floor": 1}}}}, "proj.comfyui.budget.floor"),
    ],
)
def test_a_bad_budget_is_refused_naming_its_field(
    tmp_path: Path, models: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load(tmp_path, models)


def test_the_account_state_is_read_from_account_status() -> None:
    rh = RunningHubAdapter("http://rh")
    ok = {"code": 0, "msg": "success", "data": {"currentTaskCounts": "2", "remainCoins": "177814"}}
    assert rh.parse_account(200, ok) == AccountState(2, 177814.0)
    no_coins = {"code": 0, "data": {"currentTaskCounts": 1, "remainCoins": None}}
    assert rh.parse_account(200, no_coins) == AccountState(1, None)
    assert rh.parse_account(200, {"code": 0, "data": {"remainCoins": "5"}}) is None
    assert rh.parse_account(502, {"raw": "<html>"}) is None


def test_an_automatic_hold_keeps_one_project_s_paid_target_and_no_other() -> None:
    paused = Paused.of([Pause(PauseKind.HOLD, "budget:proj/runninghub", 1.0, "day budget")])
    assert paused.holds == frozenset({"budget:proj/runninghub"})
    assert paused.account(None, "proj", "comfyui", "runninghub")  # type: ignore[arg-type]
    assert not paused.account(None, "proj", "coze", "coze")  # type: ignore[arg-type]
    assert not paused.account(None, "other", "comfyui", "runninghub")  # type: ignore[arg-type]
