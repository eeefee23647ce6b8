"""Issue 28 item 2: what a paid task cost, from its platform's answer (RunningHub's per-task
consumption, Coze's usage, JimuAI's output images), priced by the configured price where
the platform reports no money."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aigcq.platforms.base import Cost, Failed, Succeeded
from aigcq.platforms.coze import CozeAdapter
from aigcq.platforms.jimuai import JimuAIAdapter, JimuCredentials
from aigcq.platforms.runninghub import RunningHubAdapter
from aigcq.scheduler.spend import Charge, charge


def rh_outputs(**fields: Any) -> dict[str, Any]:
    entry = {"fileUrl": "https://rh/1.png", "fileType": "png", "nodeId": "9", **fields}
    return {"code": 0, "msg": "success", "data": [entry, {**entry, "fileUrl": "https://rh/2.png"}]}


@pytest.mark.parametrize(
    ("fields", "cost"),
    [
        # the fields as runninghub-sdk reads them: strings, per output entry, per task
        (
            {"consumeCoins": "12", "consumeMoney": "0.35", "taskCostTime": "78"},
            Cost(money=0.35, coins=12, seconds=78),
        ),
        (
            {"consumeMoney": 0.3, "thirdPartyConsumeMoney": "0.05", "taskCostTime": 5},
            Cost(money=0.35, seconds=5),
        ),
        (
            {"consumeCoins": "7", "consumeMoney": None, "taskCostTime": "0"},
            Cost(coins=7, seconds=0),
        ),
        ({"taskCostTime": "x", "consumeCoins": "-1"}, Cost()),  # unreadable: not a figure
        ({}, Cost()),
    ],
)
def test_runninghub_reports_what_a_task_consumed(fields: dict[str, Any], cost: Cost) -> None:
    rh = RunningHubAdapter("https://www.runninghub.cn")
    queried = rh.parse_query(200, rh_outputs(**fields))
    assert isinstance(queried, Succeeded) and queried.cost == pytest.approx(cost)
    webhook = {"event": "TASK_END", "taskId": "1", "eventData": json.dumps(rh_outputs(**fields))}
    ended = rh.parse_result(webhook)
    assert isinstance(ended, Succeeded) and ended.cost == pytest.approx(cost)
    assert ended.data["data"][0].get("consumeCoins") == fields.get("consumeCoins")  # passed on


def test_coze_reports_tokens_and_jimuai_its_images() -> None:
    record = {
        "execute_status": "Success",
        "output": '{"Output": "x"}',
        "usage": {"input_count": 50, "token_count": 150, "output_count": 100},
    }
    coze = CozeAdapter("https://api.coze.cn").parse_query(200, {"code": 0, "data": [record]})
    assert isinstance(coze, Succeeded) and coze.cost == Cost(tokens=150)
    jimu = JimuAIAdapter("https://visual.volcengineapi.com")
    urls = [f"https://img/{i}" for i in range(3)]
    body = {"code": 10000, "data": {"status": "done", "image_urls": urls}, "message": "Success"}
    done = jimu.parse_query(200, body)
    assert isinstance(done, Succeeded) and done.cost == Cost(units=3)  # billed per image
    failed = jimu.parse_query(400, {"code": 50511, "message": "Post Img Risk Not Pass"})
    assert isinstance(failed, Failed) and failed.cost == Cost(units=0)  # no image delivered


@pytest.mark.parametrize(
    ("cost", "price", "expected"),
    [
        (Cost(money=0.35, coins=12, seconds=78), 0.1, Charge(0.35, False, 12, 78)),
        (Cost(coins=12), 0.1, Charge(0.1, True, 12)),  # coins only: the money is estimated
        (Cost(units=3), 0.2, Charge(0.6, True)),
        (Cost(units=0), 0.2, Charge(0.0, True)),
        (Cost(), None, Charge(0.0, True)),  # no price configured: 0, an estimate
    ],
)
def test_a_charge_is_the_platform_s_money_else_the_configured_price(
    cost: Cost, price: float | None, expected: Charge
) -> None:
    assert charge(cost, price) == expected


def test_accounts_are_named_without_their_secrets() -> None:
    rh = RunningHubAdapter("https://www.runninghub.cn")
    assert rh.account_id("0123456789abcdef0123456789abcdef") == rh.account_id(
        "0123456789abcdef0123456789abcdef"
    )
    assert "0123456789" not in rh.account_id("0123456789abcdef0123456789abcdef")
    assert rh.account_id("a") != rh.account_id("b")
    jimu = JimuAIAdapter("")
    assert jimu.account_id(JimuCredentials("AKLTx", "secret").pack()) == "AKLTx"
