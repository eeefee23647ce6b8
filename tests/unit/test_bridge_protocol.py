"""The bridge protocol models: seed-format messages, our supersets, errors, round trips."""

from __future__ import annotations

import json
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from aigcq.wire.bridge import (
    AckBody,
    BridgeMessage,
    ErrorData,
    ErrorMessage,
    HeartbeatData,
    HeartbeatMessage,
    InstanceInfo,
    NodeInfo,
    OutputFile,
    PingMessage,
    PongMessage,
    ProtocolError,
    RegisterData,
    RegisterMessage,
    TaskAckData,
    TaskAckMessage,
    TaskAssignData,
    TaskAssignMessage,
    TaskEndBody,
    TaskEndResult,
    TaskProgressData,
    TaskProgressMessage,
    encode,
    parse_bridge_message,
)

M = TypeVar("M", bound=BaseModel)

# The seed's own examples (seed 002), verbatim.
SEED_MESSAGES: list[dict[str, Any]] = [
    {
        "type": "REGISTER",
        "data": {
            "bridgeId": "uuid字符串",
            "instanceCount": 8,
            "availableInstanceCount": 5,
            "timestamp": "2024-01-01T00:00:00.000Z",
        },
    },
    {
        "type": "HEARTBEAT",
        "data": {
            "instanceCount": 8,
            "availableInstanceCount": 5,
            "busyInstanceCount": 3,
            "timestamp": "2024-01-01T00:00:00.000Z",
        },
    },
    {
        "type": "TASK_ACK",
        "data": {
            "code": 0,
            "msg": "success",
            "data": {"taskId": "1910246754753896450", "taskStatus": "RUNNING"},
        },
    },
    {"type": "PONG"},
    {
        "type": "TASK_ASSIGN",
        "data": {
            "workflowId": "1904136902449209346",
            "nodeInfoList": [
                {"nodeId": "6", "fieldName": "text", "fieldValue": "1 girl in classroom"},
                {"nodeId": "3", "fieldName": "seed", "fieldValue": "1231231"},
            ],
            "webhookUrl": "https://shuzhiren.xueai.art/callback",
        },
    },
    {"type": "PING"},
]


@pytest.mark.parametrize("message", SEED_MESSAGES, ids=lambda m: m["type"])
def test_seed_messages_parse_and_encode_unchanged(message: dict[str, Any]) -> None:
    parsed = parse_bridge_message(json.dumps(message))
    assert json.loads(encode(parsed)) == message


def test_our_supersets() -> None:
    raw = {
        "type": "REGISTER",
        "data": {
            "bridgeId": "b1",
            "instanceCount": 2,
            "availableInstanceCount": 1,
            "instances": [
                {"instanceId": "a", "url": "http://a", "state": "busy", "taskId": "t1"},
                {"instanceId": "b", "url": "http://b", "state": "idle"},
            ],
            "tasks": ["t1"],
            "version": "0.1.0",
            "somethingNew": True,
        },
    }
    msg = parse_bridge_message(json.dumps(raw).encode())
    assert isinstance(msg, RegisterMessage)
    assert msg.data.tasks == ["t1"]
    assert msg.data.instances is not None
    assert msg.data.instances[0].task_id == "t1"
    assign = parse_bridge_message(
        '{"type":"TASK_ASSIGN","data":{"taskId":"t","attempt":2,"webhookUrl":"http://h/cb?s=1",'
        '"workflow":"{\\"1\\":{}}"}}'
    )
    assert isinstance(assign, TaskAssignMessage)
    assert (assign.data.task_id, assign.data.attempt, assign.data.workflow) == ("t", 2, '{"1":{}}')


@pytest.mark.parametrize(
    ("raw", "code", "mentions"),
    [
        ("{not json", "JSONError", "malformed JSON"),
        (b"\xff\xfe", "JSONError", "malformed JSON"),
        ("[1, 2]", "InvalidMessage", "JSON object"),
        ('{"data": {}}', "InvalidMessage", "type"),
        ('{"type": "HELLO"}', "UnknownType", "HELLO"),
        ('{"type": "REGISTER"}', "InvalidMessage", "data"),
        (
            '{"type": "REGISTER", "data": {"bridgeId": "b", "availableInstanceCount": 1}}',
            "InvalidMessage",
            "data.instanceCount",
        ),
        (
            '{"type": "REGISTER", "data": {"bridgeId": "b", "instanceCount": "8.0",'
            ' "availableInstanceCount": 1}}',
            "InvalidMessage",
            "data.instanceCount",
        ),
        (
            '{"type": "HEARTBEAT", "data": {"instanceCount": -1, "availableInstanceCount": 0}}',
            "InvalidMessage",
            "data.instanceCount",
        ),
        ('{"type": "TASK_ACK", "data": {"code": 0, "msg": "ok"}}', "InvalidMessage", "data.data"),
        (
            '{"type": "TASK_ASSIGN", "data": {"webhookUrl": "http://x"}}',
            "InvalidMessage",
            "workflowId or workflow",
        ),
    ],
)
def test_bad_input_names_the_problem(raw: str | bytes, code: str, mentions: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_bridge_message(raw)
    assert info.value.code == code
    assert mentions in info.value.msg
    error = json.loads(encode(info.value.to_message()))
    assert error == {"type": "ERROR", "data": {"code": code, "msg": info.value.msg}}


# ---- what a Node.js bridge sends (issue 30 item 4) ---------------------------------------


def test_counts_sent_as_digit_strings_are_read_as_numbers() -> None:
    """A Node.js bridge may send its counts as text; the seed's service coerced them."""
    beat = parse_bridge_message(
        '{"type": "HEARTBEAT", "data": {"instanceCount": "8", "availableInstanceCount": "5",'
        ' "busyInstanceCount": "3", "timestamp": "2024-01-01T00:00:00.000Z"}}'
    )
    assert isinstance(beat, HeartbeatMessage)
    assert (beat.data.instance_count, beat.data.available_instance_count) == (8, 5)
    assert beat.data.busy_instance_count == 3
    assert json.loads(encode(beat))["data"]["instanceCount"] == 8  # sent on as a number
    register = parse_bridge_message(
        '{"type": "REGISTER", "data": {"bridgeId": "b", "instanceCount": "2",'
        ' "availableInstanceCount": "0"}}'
    )
    assert isinstance(register, RegisterMessage)
    assert (register.data.instance_count, register.data.available_instance_count) == (2, 0)
    refusal = parse_bridge_message(
        '{"type": "TASK_ACK", "data": {"code": 421, "msg": "busy", "instanceCount": "2",'
        ' "availableInstanceCount": "0", "data": {"taskId": "t"}}}'
    )
    assert isinstance(refusal, TaskAckMessage) and refusal.data.has_counts


def test_numeric_task_ids_are_read_as_their_decimal_text() -> None:
    """Every digit is kept: JavaScript would have rounded this one (beyond 2**53)."""
    ack = parse_bridge_message(
        '{"type": "TASK_ACK", "data": {"code": 0, "msg": "success",'
        ' "data": {"taskId": 1910246754753896450, "taskStatus": "RUNNING"}}}'
    )
    assert isinstance(ack, TaskAckMessage) and ack.data.data.task_id == "1910246754753896450"
    progress = parse_bridge_message(
        '{"type": "TASK_PROGRESS", "data": {"taskId": 42, "value": 1, "max": 2}}'
    )
    assert isinstance(progress, TaskProgressMessage) and progress.data.task_id == "42"
    beat = parse_bridge_message(
        '{"type": "HEARTBEAT", "data": {"instanceCount": 1, "availableInstanceCount": 0,'
        ' "instances": [{"instanceId": "i", "url": "u", "state": "busy", "taskId": 7}]}}'
    )
    assert isinstance(beat, HeartbeatMessage) and beat.data.instances is not None
    assert beat.data.instances[0].task_id == "7"


@pytest.mark.parametrize("count", ['"8.0"', '"-1"', '" 8"', '""', '"eight"', '"８"', "true"])
def test_a_count_in_any_other_form_is_refused_naming_the_field(count: str) -> None:
    data = f'{{"instanceCount": {count}, "availableInstanceCount": 0}}'
    raw = f'{{"type": "HEARTBEAT", "data": {data}}}'
    with pytest.raises(ProtocolError) as info:
        parse_bridge_message(raw)
    assert info.value.code == "InvalidMessage"
    assert info.value.msg.startswith("HEARTBEAT data.instanceCount: ")


@pytest.mark.parametrize("task_id", ["1.5", "true", "null", "[1]"])
def test_a_task_id_that_is_no_string_or_integer_is_refused(task_id: str) -> None:
    data = f'{{"code": 0, "msg": "ok", "data": {{"taskId": {task_id}}}}}'
    raw = f'{{"type": "TASK_ACK", "data": {data}}}'
    with pytest.raises(ProtocolError) as info:
        parse_bridge_message(raw)
    assert info.value.code == "InvalidMessage" and "data.data.taskId" in info.value.msg


def test_sender_restricts_types() -> None:
    parse_bridge_message('{"type": "PONG"}', sender="bridge")
    with pytest.raises(ProtocolError, match="UnknownType"):
        parse_bridge_message('{"type": "PING"}', sender="bridge")
    with pytest.raises(ProtocolError, match="UnknownType"):
        parse_bridge_message('{"type": "PONG"}', sender="hub")


def test_task_end_body_is_double_encoded() -> None:
    result = TaskEndResult(
        code=0,
        msg="success",
        data=[
            OutputFile(file_url="http://b/f.png", file_type="png", task_cost_time=3, node_id="9")
        ],
    )
    wire = TaskEndBody.build("t1", result).model_dump()
    assert wire["event"] == "TASK_END"
    assert wire["taskId"] == "t1"
    assert json.loads(wire["eventData"]) == {
        "code": 0,
        "msg": "success",
        "data": [
            {"fileUrl": "http://b/f.png", "fileType": "png", "taskCostTime": 3, "nodeId": "9"}
        ],
    }
    assert TaskEndBody.model_validate(wire).result() == result
    failed = TaskEndResult.failed("task", "NodeError", "boom").model_dump()
    assert failed == {
        "code": 1,
        "msg": "boom",
        "data": [],
        "failure": {"class": "task", "code": "NodeError", "message": "boom"},
    }
    with pytest.raises(ProtocolError, match="eventData"):
        TaskEndBody(task_id="t", event_data="{}").result()


# ---- round trip ------------------------------------------------------------------------


def build(cls: type[M], **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[M]:
    """Instances of the pydantic model ``cls`` with each field drawn from its strategy."""
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


text = st.text(max_size=12)
ints = st.integers(min_value=0, max_value=2**31)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3)
    ),
    max_leaves=8,
)
instances = st.lists(
    build(
        InstanceInfo,
        instance_id=text,
        url=text,
        state=st.sampled_from(["idle", "busy", "offline"]),
        task_id=st.none() | text,
    ),
    max_size=3,
)
optional_tasks = st.none() | st.lists(text, max_size=3)
messages: st.SearchStrategy[BridgeMessage] = st.one_of(
    build(
        RegisterMessage,
        data=build(
            RegisterData,
            bridge_id=st.text(min_size=1, max_size=12),
            instance_count=ints,
            available_instance_count=ints,
            timestamp=st.none() | text,
            instances=st.none() | instances,
            tasks=optional_tasks,
            version=st.none() | text,
        ),
    ),
    build(
        HeartbeatMessage,
        data=build(
            HeartbeatData,
            instance_count=ints,
            available_instance_count=ints,
            busy_instance_count=st.none() | ints,
            instances=st.none() | instances,
            tasks=optional_tasks,
        ),
    ),
    build(
        TaskAckMessage,
        data=build(
            TaskAckData,
            code=st.integers(),
            msg=text,
            data=build(AckBody, task_id=text, task_status=text, attempt=st.none() | ints),
        ),
    ),
    build(
        TaskProgressMessage,
        data=build(TaskProgressData, task_id=text, value=ints, max=ints, node=st.none() | text),
    ),
    build(
        TaskAssignMessage,
        data=build(
            TaskAssignData,
            task_id=st.none() | text,
            attempt=st.none() | ints,
            workflow_id=st.text(min_size=1, max_size=12),
            node_info_list=st.lists(
                build(NodeInfo, node_id=text, field_name=text, field_value=json_value),
                max_size=3,
            ),
            webhook_url=st.text(min_size=1, max_size=20),
            workflow=st.none() | text | st.dictionaries(text, json_value, max_size=3),
        ),
    ),
    build(ErrorMessage, data=build(ErrorData, code=text, msg=text)),
    st.just(PingMessage()),
    st.just(PongMessage()),
)


@given(messages)
def test_round_trip(message: BridgeMessage) -> None:
    assert parse_bridge_message(encode(message)) == message
