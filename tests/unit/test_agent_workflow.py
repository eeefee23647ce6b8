"""The bridge's workflow functions: parsing, nodeInfoList application and coercion."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aigcq.agent.settings import http_base
from aigcq.agent.workflow import WorkflowError, apply_node_info, coerce, parse_workflow
from aigcq.wire.bridge import NodeInfo

WORKFLOW: dict[str, Any] = {
    "3": {
        "class_type": "KSampler",
        "inputs": {"seed": 5, "cfg": 7.5, "denoise": 1.0, "model": ["4", 0], "add_noise": True},
    },
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat", "clip": ["4", 1]}},
    "7": {"class_type": "Custom", "inputs": {"anything": None}},
}


def info(node: str, field: str, value: Any) -> NodeInfo:
    return NodeInfo(node_id=node, field_name=field, field_value=value)


def test_seed_example_is_applied_with_types_kept() -> None:
    out = apply_node_info(
        WORKFLOW,
        [info("6", "text", "1 girl in classroom"), info("3", "seed", "1231231")],
    )
    assert out["6"]["inputs"]["text"] == "1 girl in classroom"
    assert out["3"]["inputs"]["seed"] == 1231231
    assert out["3"]["inputs"]["model"] == ["4", 0]
    assert WORKFLOW["3"]["inputs"]["seed"] == 5  # the input is not modified


@pytest.mark.parametrize(
    ("value", "current", "expected"),
    [
        ("42", 0, 42),
        (" 42 ", 0, 42),
        ("18446744073709551615", 0, 18446744073709551615),  # a 64-bit seed stays exact
        ("3.0", 0, 3),
        (7.0, 0, 7),
        (True, 0, 1),
        ("2.5", 1.0, 2.5),
        (3, 1.0, 3.0),
        ("true", False, True),
        ("0", True, False),
        ("No", True, False),
        (1, False, True),
        (12, "", "12"),
        (1.5, "", "1.5"),
        (True, "", "true"),
        ("日本", "", "日本"),
        ({"a": 1}, None, {"a": 1}),
    ],
)
def test_coerce(value: Any, current: Any, expected: Any) -> None:
    result = coerce(value, current)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("value", "current"),
    [("abc", 0), ("2.5", 0), (2.5, 0), ("maybe", True), (2, True), ("x", 1.0), (True, 1.0)],
)
def test_coerce_refuses(value: Any, current: Any) -> None:
    with pytest.raises(ValueError):
        coerce(value, current)


@pytest.mark.parametrize(
    ("entry", "mentions"),
    [
        (info("99", "text", "x"), "node '99' is not in the workflow"),
        (info("6", "txt", "x"), "CLIPTextEncode has no such input"),
        (info("3", "model", "x"), "link"),
        (info("3", "seed", "lots"), "not an integer"),
    ],
)
def test_bad_entries_fail_clearly(entry: NodeInfo, mentions: str) -> None:
    with pytest.raises(WorkflowError, match=mentions) as err:
        apply_node_info(WORKFLOW, [entry])
    assert f"node {entry.node_id!r} field {entry.field_name!r}" in str(err.value)


def test_untyped_input_takes_the_value() -> None:
    out = apply_node_info(WORKFLOW, [info("7", "anything", [1, 2])])
    assert out["7"]["inputs"]["anything"] == [1, 2]


def test_parse_workflow() -> None:
    assert parse_workflow(json.dumps(WORKFLOW)) == WORKFLOW
    assert parse_workflow(WORKFLOW) == WORKFLOW
    for bad, mentions in [
        ("{nope", "not valid JSON"),
        ("[1]", "JSON object"),
        ({"nodes": [], "links": []}, "UI format"),
        ({"1": {"inputs": {}}}, "class_type"),
        ({"1": "x"}, "API-format"),
    ]:
        with pytest.raises(WorkflowError, match=mentions):
            parse_workflow(bad)


@pytest.mark.parametrize(
    ("ws", "http"),
    [
        ("ws://h:8080/ws", "http://h:8080"),
        ("wss://q.example.com/bridge/ws?token=x", "https://q.example.com"),
    ],
)
def test_http_base(ws: str, http: str) -> None:
    assert http_base(ws) == http
