"""An operator's incident controls in the admin API (admin token): pause and resume a
project, a paid account, a workflow or a bridge (:mod:`aigcq.scheduler.pauses`); cancel
and replay tasks by filter (:mod:`aigcq.serve.by_filter`).

Bad input (an unknown kind or field, a name ``model.json`` does not know) is refused with
``ControlError`` (400) naming what is wrong and what is known, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Header, Request
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from aigcq.domain import ErrorCode, TaskState
from aigcq.gateway.errors import ClientError, error_responses
from aigcq.gateway.http_api import json_object, require_admin
from aigcq.queue.listing import REPLAYABLE, TaskFilter
from aigcq.scheduler.pauses import PauseError, PauseKind, Pauses
from aigcq.serve.by_filter import (
    CANCELLABLE,
    FilterError,
    cancel_matching,
    replay_matching,
    task_filter,
)
from aigcq.serve.parts import ServeParts

Authorization = Annotated[str | None, Header()]
BODY_LIMIT = 64 * 1024  # a control's body is a few fields
MAX_LIMIT = 10_000  # tasks one cancel or replay by filter acts on, at most
CONTROL_ERRORS = error_responses(ErrorCode.JSON, ErrorCode.CONTROL, ErrorCode.AUTH)

_Body = TypeVar("_Body", bound=BaseModel)


class PauseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["project", "account", "workflow", "bridge", "hold"]
    name: str = Field(
        description="project, runninghub or proj/runninghub, workflowId, bridgeId; hold "
        "(resume only): budget:proj/runninghub or drift:proj/runninghub"
    )
    note: str = Field("", max_length=500, description="why (shown with the pause)")


class FilterBody(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    state: str = Field("", description="states, comma-separated [cancel: the live ones; "
                       "replay: failed]")  # fmt: skip
    project: str = Field("", validation_alias=AliasChoices("project", "aigc"))
    platform: str = ""
    client: str = Field("", description="the client's backendId")
    target: str = Field("", description="where it runs or ran: bridge, runninghub...")
    since: float = Field(0.0, ge=0, description="its last change at or after (epoch s)")
    dryRun: bool = Field(False, description="say which tasks, change nothing")
    limit: int = Field(1000, ge=1, le=MAX_LIMIT, description="act on this many at most")


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a route that reads its JSON body itself, after its auth check."""
    schema = {"schema": model.model_json_schema()}
    return {"requestBody": {"required": True, "content": {"application/json": schema}}}


async def control_body(request: Request, model: type[_Body]) -> _Body:
    """The request's body as ``model``; ``ControlError`` naming the first field wrong."""
    try:
        return model.model_validate(await json_object(request, BODY_LIMIT))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ClientError(ErrorCode.CONTROL, f"{where}: {first['msg']}") from exc


def control_routes(router: APIRouter, service: ServeParts) -> None:
    gw, pauses = service.gateway, Pauses(service.rt)

    @router.get(
        "/api/admin/pauses",
        summary="What is paused now, on every process",
        responses=error_responses(ErrorCode.AUTH),
    )
    async def paused(authorization: Authorization = None) -> dict[str, Any]:
        require_admin(gw, authorization)
        return {"pauses": [p.view() for p in await pauses.all()]}

    for action, summary in (
        ("pause", "Hold a project, paid account, workflow or bridge: its tasks wait"),
        ("resume", "Lift a pause: what waited is dispatched"),
    ):
        router.add_api_route(
            f"/api/admin/{action}",
            _pause_route(service, pauses, paused=action == "pause"),
            methods=["POST"],
            name=action,
            summary=summary,
            responses=CONTROL_ERRORS,
            openapi_extra=body_schema(PauseBody),
        )

    for action, acts_on, default, act in (
        ("cancel", CANCELLABLE, CANCELLABLE, cancel_matching),
        ("replay", REPLAYABLE, frozenset({TaskState.FAILED}), replay_matching),
    ):
        router.add_api_route(
            f"/api/admin/tasks/{action}",
            _filter_route(service, acts_on, default, act),
            methods=["POST"],
            name=f"{action}_matching",
            summary=f"{action.capitalize()} the tasks a filter admits",
            responses=CONTROL_ERRORS,
            openapi_extra=body_schema(FilterBody),
        )


def _filter_route(
    service: ServeParts,
    acts_on: frozenset[TaskState],
    default: frozenset[TaskState],
    act: Callable[..., Awaitable[dict[str, Any]]],
) -> Any:
    async def route(request: Request, authorization: Authorization = None) -> dict[str, Any]:
        require_admin(service.gateway, authorization)
        body = await control_body(request, FilterBody)
        wanted = _filter(service, body, acts_on, default)
        return await act(service.lifecycle, wanted, limit=body.limit, dry_run=body.dryRun)

    return route


def _filter(
    service: ServeParts,
    body: FilterBody,
    acts_on: frozenset[TaskState],
    default: frozenset[TaskState],
) -> TaskFilter:
    rt = service.rt
    targets = [*rt.platforms.adapters, *([service.internal.name] if service.internal else [])]
    fields = body.model_dump(exclude={"dryRun", "limit", "state"})
    try:
        return task_filter(
            rt, targets, acts_on=acts_on, default=default, state=body.state, **fields
        )
    except FilterError as exc:
        raise ClientError(ErrorCode.CONTROL, str(exc)) from exc


def _pause_route(service: ServeParts, pauses: Pauses, *, paused: bool) -> Any:
    async def route(request: Request, authorization: Authorization = None) -> dict[str, Any]:
        require_admin(service.gateway, authorization)
        body = await control_body(request, PauseBody)
        kind = PauseKind(body.kind)
        if kind is PauseKind.HOLD and paused:
            message = "holds are automatic (budgets, drift): pause the account instead"
            raise ClientError(ErrorCode.CONTROL, message)
        name = checked(pauses, kind, body.name)
        changed = await pauses.set(kind, name, paused, body.note)
        if kind is PauseKind.BRIDGE and service.hub is not None:
            await service.hub.drain(name, paused)  # here at once; elsewhere by the next round
        return {"kind": kind.value, "name": name, "paused": paused, "changed": changed}

    return route


def checked(pauses: Pauses, kind: PauseKind, name: str) -> str:
    try:
        return pauses.checked_name(kind, name)
    except PauseError as exc:
        raise ClientError(ErrorCode.CONTROL, str(exc)) from exc
