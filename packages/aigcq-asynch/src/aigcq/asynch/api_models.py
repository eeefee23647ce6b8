"""Model and model-type endpoints, and autoTune."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from aigcq.asynch.autotune import auto_tune
from aigcq.asynch.hosts import check_model_host
from aigcq.asynch.http import camel, parse_body, reply, require_admin, service
from aigcq.asynch.schemas import (
    INT32_MAX,
    AutoTune,
    ModelCreate,
    ModelRef,
    ModelTypeCreate,
    ModelTypeRef,
    ModelTypeUpdate,
    ModelUpdate,
)

MAX_PAGE = 1_000_000
DEFAULT_PAGE_SIZE = 20


@dataclass(frozen=True)
class Page:
    offset: int
    limit: int


def paging(
    page: int = Query(1, ge=0, le=MAX_PAGE),
    page_size: int = Query(DEFAULT_PAGE_SIZE, ge=0, le=500, alias="pageSize"),
) -> Page:
    """``page`` / ``pageSize``; 0 (a Go int left unset) means the default, 1 and 20."""
    page, size = page or 1, page_size or DEFAULT_PAGE_SIZE
    return Page((page - 1) * size, size)


Paging = Annotated[Page, Depends(paging)]


# Every /model route is management: the admin token when one is set.
router = APIRouter(prefix="/model", dependencies=[Depends(require_admin)])


@router.post("/createModel")
async def create_model(request: Request) -> Response:
    body = await parse_body(request, ModelCreate)
    svc = service(request)
    check_model_host(str(body.base_url), svc.settings.model_hosts)
    row = await svc.models.create(body.model_name, body.columns())
    return reply(camel(row))


@router.post("/updateModel")
async def update_model(request: Request) -> Response:
    body = await parse_body(request, ModelUpdate)
    svc = service(request)
    if body.base_url is not None:
        check_model_host(str(body.base_url), svc.settings.model_hosts)
    row = await svc.models.update(body.model_name, body.columns())
    return reply(camel(row))


@router.post("/deleteModel")
async def delete_model(request: Request) -> Response:
    body = await parse_body(request, ModelRef)
    await service(request).models.delete(body.model_name)
    return reply({"modelName": body.model_name})


@router.get("/getModel")
async def get_model(
    request: Request, model_name: str = Query(alias="modelName", max_length=128)
) -> Response:
    return reply(camel(await service(request).models.get(model_name)))


@router.get("/listModel")
async def list_models(
    request: Request, page: Paging, enabled: int | None = Query(None, ge=0, le=1)
) -> Response:
    rows = await service(request).models.list_models(enabled, page.offset, page.limit)
    return reply([camel(r) for r in rows])


@router.post("/type/createModelType")
async def create_model_type(request: Request) -> Response:
    body = await parse_body(request, ModelTypeCreate)
    return reply(camel(await service(request).types.create(body.columns())))


@router.post("/type/updateModelType")
async def update_model_type(request: Request) -> Response:
    body = await parse_body(request, ModelTypeUpdate)
    return reply(camel(await service(request).types.update(body.type_id, body.columns())))


@router.post("/type/deleteModelType")
async def delete_model_type(request: Request) -> Response:
    body = await parse_body(request, ModelTypeRef)
    await service(request).types.delete(body.type_id)
    return reply({"typeId": body.type_id})


@router.get("/type/getModelType")
async def get_model_type(
    request: Request, type_id: int = Query(alias="typeId", ge=1, le=INT32_MAX)
) -> Response:
    return reply(camel(await service(request).types.get(type_id)))


@router.get("/type/listModelType")
async def list_model_types(request: Request, page: Paging) -> Response:
    rows = await service(request).types.list_types(page.offset, page.limit)
    return reply([camel(r) for r in rows])


@router.post("/autoTune")
async def auto_tune_route(request: Request) -> Response:
    body = await parse_body(request, AutoTune)
    svc = service(request)
    ttl = svc.settings.runtime_ttl_seconds
    return reply({"models": await auto_tune(svc.pool, svc.redis, body.window_seconds, ttl)})
