"""The bridge WebSocket protocol (seed 002 plus our strict supersets) and the TASK_END body.

Every WebSocket frame is ``{"type": ..., "data": {...}}``; ``PING``/``PONG`` carry no data.
Field names on the wire are camelCase (``bridgeId``); the models use snake_case attributes
and accept either spelling. Unknown extra fields are ignored, so seed-format messages and
newer bridges both parse. Values are strict, except the forms a Node.js bridge sends that
the seed's service coerced: counts as digit strings, task ids as integers
(:mod:`aigcq.plumbing.js_values`). See ``docs/bridge-protocol.md``.

Shared by the hub (:mod:`aigcq.bridges`, distribution ``aigcq``) and the reference bridge
(:mod:`aigcq.agent`, distribution ``aigcq-bridge``); it ships in ``aigcq-wire``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from aigcq.plumbing.js_values import Count, IdText

# ---- TASK_ACK codes (non-zero = "cannot take it", the hub requeues) ---------------------
ACK_OK = 0
ACK_WORKFLOW_NOT_FOUND = 380  # RunningHub WORKFLOW_NOT_EXISTS
ACK_NO_CAPACITY = 421  # RunningHub TASK_QUEUE_MAXED

# ---- close codes of the bridge WebSocket (the hub closes, the bridge reads them) --------
CLOSE_AUTH = 4401  # bad or missing token: the bridge does not retry with it
CLOSE_FLOOD = 4008  # over its message rate
CLOSE_TIMEOUT = 4000
CLOSE_REGISTER_TIMEOUT = 4408  # no REGISTER within AIGCQ_BRIDGE_REGISTER_TIMEOUT_S

NonNegInt = Annotated[int, Field(ge=0)]
PositiveInt = Annotated[int, Field(gt=0)]


class ProtocolError(Exception):
    """A message that cannot be accepted. ``code`` is one of ``JSONError``, ``UnknownType``,
    ``InvalidMessage``; ``msg`` names the problem (and the field, if any)."""

    def __init__(self, code: str, msg: str) -> None:
        super().__init__(f"{code}: {msg}")
        self.code = code
        self.msg = msg

    def to_message(self) -> ErrorMessage:
        """The ``ERROR`` frame a hub sends back for this error."""
        return ErrorMessage(data=ErrorData(code=self.code, msg=self.msg))


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        strict=True,
        extra="ignore",
        frozen=True,
    )


def utc_timestamp() -> str:
    """Now as the seed writes it: ``2024-01-01T00:00:00.000Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---- payloads --------------------------------------------------------------------------


class InstanceInfo(_Model):
    """One ComfyUI instance behind a bridge."""

    instance_id: str
    url: str
    state: Literal["idle", "busy", "offline"]
    task_id: IdText | None = None
    node_classes: list[str] | None = None  # from its /object_info
    models: list[str] | None = None  # model files its loaders offer
    device: str | None = None  # from its /system_stats: the torch device's name
    vram_total: NonNegInt | None = None  # bytes
    vram_free: NonNegInt | None = None  # bytes
    slots: PositiveInt | None = None  # ours: prompts it runs at once (absent: 1)


class RegisterData(_Model):
    bridge_id: str = Field(min_length=1)
    instance_count: Count
    available_instance_count: Count
    timestamp: str | None = None
    instances: list[InstanceInfo] | None = None
    tasks: list[str] | None = None  # task ids the bridge still holds (after a reconnect)
    version: str | None = None
    token: str | None = None
    #: ours: the bridge sends CAPACITY when an instance's state changes (see CapacityData)
    capacity_reports: bool | None = None


class HeartbeatData(_Model):
    instance_count: Count
    available_instance_count: Count
    busy_instance_count: Count | None = None
    timestamp: str | None = None
    instances: list[InstanceInfo] | None = None
    tasks: list[str] | None = None


class CapacityData(HeartbeatData):
    """Ours: the bridge's counts when an instance's state changes (busy, free after a
    cancel, offline, online), as a HEARTBEAT carries them. ``seq`` grows with every report a
    bridge builds (from 1, per bridge process): a report older than one the hub applied is
    dropped."""

    seq: NonNegInt


class AckBody(_Model):
    task_id: IdText
    task_status: str = "RUNNING"
    attempt: int | None = None


class TaskAckData(_Model):
    """Seed fields plus ours: a refusal may carry the bridge's current counts (both
    ``instanceCount`` and ``availableInstanceCount``, optionally ``instances`` and ``tasks``
    as in HEARTBEAT), which the hub applies at once instead of guessing."""

    code: int = ACK_OK
    msg: str = "success"
    data: AckBody
    instance_count: Count | None = None
    available_instance_count: Count | None = None
    instances: list[InstanceInfo] | None = None
    tasks: list[str] | None = None

    @property
    def has_counts(self) -> bool:
        return self.instance_count is not None and self.available_instance_count is not None


class TaskProgressData(_Model):
    task_id: IdText
    value: int
    max: int
    node: str | None = None
    node_name: str | None = None  # the node's ``_meta.title``, else its ``class_type``


class NodeInfo(_Model):
    """One input override: ``workflow[node_id].inputs[field_name] = field_value``."""

    node_id: str
    field_name: str
    field_value: Any

    @model_serializer(mode="wrap")
    def _keep_null_value(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        out.setdefault("fieldValue", None)  # a null value survives exclude_none
        return out


class TaskAssignData(_Model):
    """Seed fields plus ours: ``taskId``, ``attempt``, an optional inline ``workflow``
    (API format, as a dict or a JSON string) and ``instanceId``, the instance the hub
    counted the task on (free and able to run it, as the bridge last reported): a bridge
    takes that one if it is still free and can. A seed hub sends no ``taskId``.
    ``traceparent``: the W3C trace context of this attempt (its ``process`` span), when
    the task is traced: a bridge that traces continues the task's trace under it; others
    ignore it."""

    task_id: str | None = None
    attempt: int | None = None
    instance_id: str | None = None
    workflow_id: str | None = None
    node_info_list: list[NodeInfo] = Field(default_factory=list)
    webhook_url: str = Field(min_length=1)
    workflow: dict[str, Any] | str | None = None
    traceparent: str | None = Field(None, max_length=256)

    @model_validator(mode="after")
    def _has_workflow(self) -> Self:
        if not self.workflow_id and self.workflow is None:
            raise ValueError("workflowId or workflow is required")
        return self


class TaskCancelData(_Model):
    """Stop ``taskId`` (this attempt, if given): cancelled, or superseded elsewhere."""

    task_id: str = Field(min_length=1)
    attempt: int | None = None


class ErrorData(_Model):
    code: str
    msg: str


# ---- envelopes -------------------------------------------------------------------------


class _Message(_Model):
    """A frame: ``type`` (a subclass's ``Literal``, with its value as default) and ``data``."""

    TYPE: ClassVar[str]  # the ``type`` value, taken from that default

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.TYPE = cls.model_fields["type"].default


class RegisterMessage(_Message):
    type: Literal["REGISTER"] = "REGISTER"
    data: RegisterData


class HeartbeatMessage(_Message):
    type: Literal["HEARTBEAT"] = "HEARTBEAT"
    data: HeartbeatData


class TaskAckMessage(_Message):
    type: Literal["TASK_ACK"] = "TASK_ACK"
    data: TaskAckData


class CapacityMessage(_Message):
    type: Literal["CAPACITY"] = "CAPACITY"
    data: CapacityData


class TaskProgressMessage(_Message):
    type: Literal["TASK_PROGRESS"] = "TASK_PROGRESS"
    data: TaskProgressData


class PongMessage(_Message):
    type: Literal["PONG"] = "PONG"
    data: dict[str, Any] | None = None


class TaskAssignMessage(_Message):
    type: Literal["TASK_ASSIGN"] = "TASK_ASSIGN"
    data: TaskAssignData


class TaskCancelMessage(_Message):
    type: Literal["TASK_CANCEL"] = "TASK_CANCEL"
    data: TaskCancelData


class PingMessage(_Message):
    type: Literal["PING"] = "PING"
    data: dict[str, Any] | None = None


class ErrorMessage(_Message):
    type: Literal["ERROR"] = "ERROR"
    data: ErrorData


BridgeMessage = (
    RegisterMessage
    | HeartbeatMessage
    | CapacityMessage
    | TaskAckMessage
    | TaskProgressMessage
    | PongMessage
    | TaskAssignMessage
    | TaskCancelMessage
    | PingMessage
    | ErrorMessage
)

_FROM_BRIDGE: tuple[type[_Message], ...] = (
    RegisterMessage,
    HeartbeatMessage,
    CapacityMessage,
    TaskAckMessage,
    TaskProgressMessage,
    PongMessage,
)
_FROM_HUB: tuple[type[_Message], ...] = (
    TaskAssignMessage,
    TaskCancelMessage,
    PingMessage,
    ErrorMessage,
)
MESSAGE_TYPES: dict[str, type[_Message]] = {m.TYPE: m for m in _FROM_BRIDGE + _FROM_HUB}
#: Message types each side may send.
FROM_BRIDGE = frozenset(m.TYPE for m in _FROM_BRIDGE)
FROM_HUB = frozenset(m.TYPE for m in _FROM_HUB)


def _describe(err: ValidationError) -> str:
    """``data.instanceCount: Field required; ...`` for the first few errors."""
    parts = []
    for e in err.errors()[:3]:
        field = ".".join(str(p) for p in e["loc"])
        parts.append(f"{field}: {e['msg']}" if field else e["msg"])
    return "; ".join(parts)


def parse_bridge_message(
    raw: str | bytes, *, sender: Literal["bridge", "hub"] | None = None
) -> BridgeMessage:
    """Parse one frame. With ``sender``, only the types that side sends are accepted.

    Raises :class:`ProtocolError` (``JSONError``, ``UnknownType``, ``InvalidMessage``).
    """
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # too deep: RecursionError
        raise ProtocolError("JSONError", f"malformed JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("InvalidMessage", "message must be a JSON object")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("InvalidMessage", "type: a string is required")
    allowed = {"bridge": FROM_BRIDGE, "hub": FROM_HUB}.get(sender or "", MESSAGE_TYPES.keys())
    model = MESSAGE_TYPES.get(kind)
    if model is None or kind not in allowed:
        origin = f" from a {sender}" if sender else ""
        raise ProtocolError("UnknownType", f"unknown message type {kind!r}{origin}")
    try:
        msg: BridgeMessage = model.model_validate(obj)  # type: ignore[assignment]
    except ValidationError as e:
        raise ProtocolError("InvalidMessage", f"{kind} {_describe(e)}") from None
    return msg


def encode(msg: BridgeMessage) -> str:
    """The wire form of ``msg``: camelCase keys, absent optional fields left out."""
    return msg.model_dump_json(exclude_none=True)


# ---- TASK_END (HTTP POST to webhookUrl) -------------------------------------------------


class OutputFile(_Model):
    file_url: str
    file_type: str
    task_cost_time: int | str = 0  # RunningHub sends both an int and a string
    node_id: str


#: a failure's class: the task's own fault (fail it, the bridge is fine) or the machine's
#: (retry elsewhere within max_attempts; counts against the bridge)
FailureClass = Literal["task", "infrastructure"]


class Failure(_Model):
    """Why a task failed: ``class``, a specific ``code`` (``PromptValidation``,
    ``NodeError``, ``InstanceLost``, ...) and a message."""

    failure_class: FailureClass = Field(alias="class")
    code: str
    message: str


class TaskEndResult(_Model):
    """The decoded ``eventData``: ``code`` 0 = success, anything else = failure; our
    bridges add ``failure`` (a seed bridge's failure has none: counted as the machine's)."""

    code: int
    msg: str
    data: list[OutputFile] = Field(default_factory=list)
    failure: Failure | None = None

    @classmethod
    def failed(cls, failure_class: FailureClass, code: str, msg: str) -> TaskEndResult:
        failure = Failure(failure_class=failure_class, code=code, message=msg)
        return cls(code=1, msg=msg, data=[], failure=failure)


def failure_of(event_data: Any) -> Failure | None:
    """The ``failure`` of a TASK_END's ``eventData`` (a dict or JSON text), if valid."""
    if isinstance(event_data, str | bytes):
        try:
            event_data = json.loads(event_data)
        except ValueError:
            return None
    if not isinstance(event_data, dict) or not isinstance(event_data.get("failure"), dict):
        return None
    try:
        return Failure.model_validate(event_data["failure"])
    except ValidationError:
        return None


class TaskEndBody(_Model):
    """The webhook body; ``eventData`` is a JSON *string* (as RunningHub sends it)."""

    event: Literal["TASK_END"] = "TASK_END"
    task_id: str
    event_data: str

    @classmethod
    def build(cls, task_id: str, result: TaskEndResult) -> TaskEndBody:
        return cls(task_id=task_id, event_data=result.model_dump_json(exclude_none=True))

    def result(self) -> TaskEndResult:
        """Decode ``eventData``; raises :class:`ProtocolError` if it is not valid."""
        try:
            return TaskEndResult.model_validate_json(self.event_data)
        except ValidationError as e:
            raise ProtocolError("InvalidMessage", f"eventData {_describe(e)}") from None
