"""Request bodies of the asynch API (camelCase on the wire, snake_case columns inside).

They decode what a Go client of the original service sends (see docs/compatibility.md):

* unknown fields are ignored; ``null`` means "not given";
* the zero value of a field whose zero is not a valid setting (``maxConcurrency``,
  ``queueLimit``, ``timeoutSeconds``, ``expectedSeconds``, ``autoCleanSeconds``,
  ``batchSize``, ``typeId`` on create; ``""`` for ``callbackUrl``, ``baseUrl`` on update,
  ``httpMethod``, ``type``) means "not given" too: the default on create, no change on update;
* a model or model-type body holding such a zero was marshalled from a Go struct whose unset
  fields are zero (no ``omitempty``), so every zero in it (``enabled: 0``, ``route: ""`` …)
  means "not given" (:class:`GoStruct`) — as the Go service's ``OmitEmpty`` writes. A body
  without one (``{"modelName": "m", "enabled": 0}``, or getModel's data sent back with one
  field changed) keeps every value it gives.

Types stay strict: an integer field takes a JSON integer only (not ``"5"``, ``true`` or
``5.0``), within the column's range.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from aigcq.asynch.headmsg import parse_head_msg

ModelName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")]
TaskId = Annotated[str, StringConstraints(min_length=1, max_length=64)]
INT32_MAX = 2_147_483_647  # the INTEGER columns
TypeIds = Annotated[str, StringConstraints(pattern=r"^(\d{1,10}(,\d{1,10})*)?$", max_length=1024)]


def _go_zero(value: Any) -> bool:
    """Go's zero value of an integer or a string field (``false`` is no integer here)."""
    return (type(value) is int and value == 0) or value == ""


def _zero_unset(value: Any) -> Any:
    """Go's zero value of a field whose zero is no valid setting: not given."""
    return None if _go_zero(value) else value


def _null_empty(value: Any) -> Any:
    return "" if value is None else value


#: Strict JSON integers within their columns' ranges.
Flag = Annotated[int, Strict(), Field(ge=0, le=1)]
NonNegative = Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)]
Positive = Annotated[int, Strict(), Field(ge=1, le=INT32_MAX)]
Concurrency = Annotated[int, Strict(), Field(ge=1, le=100_000)]
QueueLimit = Annotated[int, Strict(), Field(ge=1, le=10_000_000)]
RetryTimes = Annotated[int, Strict(), Field(ge=0, le=100)]
BatchSize = Annotated[int, Strict(), Field(ge=1, le=1000)]
Window = Annotated[int, Strict(), Field(ge=-INT32_MAX, le=366 * 86400)]
#: Go's zero value means "not given".
Unset = BeforeValidator(_zero_unset)


def _json_array(value: Any) -> Any:
    """``form`` may come as a JSON array or as a string holding one."""
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc.msg}") from exc
    return value


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


def _json_text(value: Any) -> Any:
    """``responseJsonSchema`` may come as an object or as text."""
    return value if isinstance(value, str) or value is None else json.dumps(value)


class Body(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", str_strip_whitespace=True
    )


class GoStruct(Body):
    """A body a Go client may marshal from a whole struct: when it gives one of
    ``NEVER_ZERO`` (fields whose zero is no valid setting) its zero value, every field at
    its zero value is "not given"."""

    NEVER_ZERO: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _zero_filled(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        marks = {k for f in cls.NEVER_ZERO for k in (f, to_camel(f))}
        if not any(_go_zero(v) for k, v in data.items() if k in marks):
            return data
        return {k: v for k, v in data.items() if not _go_zero(v)}


class ModelUpdate(GoStruct):
    """``/model/updateModel``: ``modelName`` plus the fields to change."""

    NEVER_ZERO = (
        "max_concurrency", "queue_limit", "timeout_seconds", "expected_seconds",
        "auto_clean_seconds", "base_url", "http_method",
    )  # fmt: skip

    model_name: ModelName
    models_type: (
        Annotated[str, StringConstraints(pattern=r"^(\d{1,10}(,\d{1,10})*)?$", max_length=1024)]
        | None
    ) = None
    form: Annotated[list[dict[str, Any]], BeforeValidator(_json_array)] | None = None
    base_url: Annotated[AnyHttpUrl | None, Unset] = None
    route: Annotated[str, StringConstraints(max_length=1024)] | None = None
    http_method: Annotated[Literal["GET", "POST"] | None, BeforeValidator(_upper), Unset] = None
    head_msg: Annotated[str, StringConstraints(max_length=8192)] | None = None
    enabled: Flag | None = None
    max_concurrency: Annotated[Concurrency | None, Unset] = None
    queue_limit: Annotated[QueueLimit | None, Unset] = None
    timeout_seconds: Annotated[Positive | None, Unset] = None
    expected_seconds: Annotated[Positive | None, Unset] = None
    retry_times: RetryTimes | None = None
    retry_queue_max_seconds: NonNegative | None = None
    auto_clean_seconds: Annotated[Positive | None, Unset] = None
    remark: Annotated[str, StringConstraints(max_length=2048)] | None = None

    @field_validator("head_msg")
    @classmethod
    def _head_msg(cls, value: str | None) -> str | None:
        if value is not None:
            parse_head_msg(value)
        return value

    def columns(self) -> dict[str, Any]:
        """The columns to write: set fields only, in database types."""
        cols = self.model_dump(exclude_unset=True, exclude={"model_name"}, exclude_none=True)
        if "base_url" in cols:
            cols["base_url"] = str(self.base_url).rstrip("/")
        if "form" in cols:
            cols["form"] = json.dumps(cols["form"])
        return cols


class ModelCreate(ModelUpdate):
    """``/model/createModel``: ``baseUrl`` is required; omitted fields take their defaults."""

    base_url: AnyHttpUrl


class ModelRef(Body):
    model_name: ModelName


class ModelTypeUpdate(GoStruct):
    NEVER_ZERO = ("type_id", "type")

    type_id: Positive
    type: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = None
    prompt_info: str | None = None
    response_json_schema: Annotated[str | None, BeforeValidator(_json_text)] = None
    version: Annotated[str, BeforeValidator(str), StringConstraints(max_length=64)] | None = None
    remark: Annotated[str, StringConstraints(max_length=2048)] | None = None

    def columns(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True, exclude={"type_id"}, exclude_none=True)


class ModelTypeCreate(ModelTypeUpdate):
    type_id: Annotated[Positive | None, Unset] = None  # type: ignore[assignment]
    type: Annotated[str, StringConstraints(min_length=1, max_length=128)]

    def columns(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True, exclude_none=True)


class ModelTypeRef(Body):
    type_id: Positive


class TaskCreate(Body):
    """``requestPayload`` must be given; ``null`` (Go's nil map or interface) is ``{}``."""

    model_name: ModelName
    request_payload: Any = Field(...)
    biz_name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    callback_url: Annotated[AnyHttpUrl | None, Unset] = None
    model_key: Annotated[str, BeforeValidator(_null_empty), StringConstraints(max_length=8192)] = ""

    @field_validator("request_payload")
    @classmethod
    def _payload(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("model_key")
    @classmethod
    def _model_key(cls, value: str) -> str:
        parse_head_msg(value, "modelKey")
        return value


class TaskBatch(Body):
    task_ids: Annotated[list[TaskId], Field(min_length=1, max_length=1000)]


class RunWork(Body):
    batch_size: Annotated[BatchSize | None, Unset] = None


class AutoTune(Body):
    """``windowSeconds`` not given or <= 0: one hour (the seed); at most a year."""

    window_seconds: Window | None = None
