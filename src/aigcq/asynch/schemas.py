"""Request bodies of the asynch API (camelCase on the wire, snake_case columns inside)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)
from pydantic.alias_generators import to_camel

from aigcq.asynch.headmsg import parse_head_msg

ModelName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")]
TaskId = Annotated[str, StringConstraints(min_length=1, max_length=64)]


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
        alias_generator=to_camel, populate_by_name=True, extra="forbid", str_strip_whitespace=True
    )


class ModelUpdate(Body):
    """``/model/updateModel``: ``modelName`` plus the fields to change."""

    model_name: ModelName
    models_type: Annotated[str, StringConstraints(pattern=r"^(\d+(,\d+)*)?$")] | None = None
    form: Annotated[list[dict[str, Any]], BeforeValidator(_json_array)] | None = None
    base_url: AnyHttpUrl | None = None
    route: Annotated[str, StringConstraints(max_length=1024)] | None = None
    http_method: Annotated[Literal["GET", "POST"], BeforeValidator(_upper)] | None = None
    head_msg: Annotated[str, StringConstraints(max_length=8192)] | None = None
    enabled: Literal[0, 1] | None = None
    max_concurrency: Annotated[int, Field(ge=1, le=100_000)] | None = None
    queue_limit: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    timeout_seconds: Annotated[int, Field(ge=1)] | None = None
    expected_seconds: Annotated[int, Field(ge=0)] | None = None
    retry_times: Annotated[int, Field(ge=0, le=100)] | None = None
    retry_queue_max_seconds: Annotated[int, Field(ge=0)] | None = None
    auto_clean_seconds: Annotated[int, Field(ge=0)] | None = None
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


class ModelTypeUpdate(Body):
    type_id: int = Field(ge=1)
    type: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = None
    prompt_info: str | None = None
    response_json_schema: Annotated[str | None, BeforeValidator(_json_text)] = None
    version: Annotated[str, BeforeValidator(str), StringConstraints(max_length=64)] | None = None
    remark: Annotated[str, StringConstraints(max_length=2048)] | None = None

    def columns(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True, exclude={"type_id"}, exclude_none=True)


class ModelTypeCreate(ModelTypeUpdate):
    type_id: int | None = Field(None, ge=1)  # type: ignore[assignment]
    type: Annotated[str, StringConstraints(min_length=1, max_length=128)]

    def columns(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True, exclude_none=True)


class ModelTypeRef(Body):
    type_id: int = Field(ge=1)


class TaskCreate(Body):
    model_name: ModelName
    request_payload: Any = Field(...)
    biz_name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    callback_url: AnyHttpUrl | None = None
    model_key: Annotated[str, StringConstraints(max_length=8192)] = ""

    @field_validator("request_payload")
    @classmethod
    def _payload(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("requestPayload is required")
        return value

    @field_validator("model_key")
    @classmethod
    def _model_key(cls, value: str) -> str:
        parse_head_msg(value, "modelKey")
        return value


class TaskBatch(Body):
    task_ids: Annotated[list[TaskId], Field(min_length=1, max_length=1000)]


class RunWork(Body):
    batch_size: int | None = Field(None, ge=1, le=1000)


class AutoTune(Body):
    window_seconds: int | None = None
