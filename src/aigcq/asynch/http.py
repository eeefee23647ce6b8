"""HTTP plumbing shared by the routers: body parsing with clear errors, JSON replies."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from aigcq.asynch.errors import AsynchError, Code, ok
from aigcq.asynch.service import AsynchService

_B = TypeVar("_B", bound=BaseModel)


def service(request: Request) -> AsynchService:
    svc: AsynchService = request.app.state.asynch
    return svc


def reply(data: Any = None) -> Response:
    return Response(orjson.dumps(ok(data)), media_type="application/json")


def error_response(exc: AsynchError) -> Response:
    return Response(orjson.dumps(exc.body()), status_code=exc.status, media_type="application/json")


def camel(row: dict[str, Any]) -> dict[str, Any]:
    return {to_camel(k): v for k, v in row.items()}


async def parse_body(request: Request, model: type[_B]) -> _B:
    """Read and validate a JSON body: ``PAYLOAD_TOO_LARGE`` / ``INVALID_ARGUMENT`` on failure."""
    limit = service(request).settings.max_payload_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise AsynchError(Code.PAYLOAD_TOO_LARGE, f"body is larger than {limit} bytes")
    body = await request.body()
    if len(body) > limit:
        raise AsynchError(Code.PAYLOAD_TOO_LARGE, f"body is larger than {limit} bytes")
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        raise invalid(exc.errors()) from None


def invalid(errors: Any) -> AsynchError:
    """``INVALID_ARGUMENT`` naming the first bad field."""
    first = next(iter(errors))
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query"))
    message = first.get("msg", "invalid")
    return AsynchError(Code.INVALID_ARGUMENT, f"{where}: {message}" if where else message)


def validation_error(exc: RequestValidationError) -> AsynchError:
    return invalid(exc.errors())
