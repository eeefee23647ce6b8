"""HTTP plumbing shared by the routers: body parsing with clear errors, JSON replies."""

from __future__ import annotations

import hmac
from typing import Any, TypeVar

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from aigcq.asynch.errors import AsynchError, Code, ok
from aigcq.asynch.process import AsynchProcess
from aigcq.plumbing.auth import bearer

_B = TypeVar("_B", bound=BaseModel)


def service(request: Request) -> AsynchProcess:
    svc: AsynchProcess = request.app.state.asynch
    return svc


def reply(data: Any = None, **beside: Any) -> Response:
    """A success: ``data`` in the envelope, with ``beside`` as further top-level fields."""
    return Response(orjson.dumps(ok(data) | beside), media_type="application/json")


def error_response(exc: AsynchError) -> Response:
    return Response(
        orjson.dumps(exc.body()),
        status_code=exc.status,
        headers=exc.headers or None,
        media_type="application/json",
    )


def camel(row: dict[str, Any]) -> dict[str, Any]:
    return {to_camel(k): v for k, v in row.items()}


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with ``PAYLOAD_TOO_LARGE`` past ``limit`` bytes: by its declared
    Content-Length, or while reading it (a chunked body has none)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise AsynchError(Code.PAYLOAD_TOO_LARGE, f"body is larger than {limit} bytes")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise AsynchError(Code.PAYLOAD_TOO_LARGE, f"body is larger than {limit} bytes")
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def parse_body(request: Request, model: type[_B]) -> _B:
    """Read and validate a JSON body: ``PAYLOAD_TOO_LARGE`` / ``INVALID_ARGUMENT`` on failure.

    Fields the model does not know are ignored (as Go's decoder does); no string anywhere in
    the body may hold a NUL character (PostgreSQL cannot store one)."""
    body = await read_body(request, service(request).settings.max_payload_bytes)
    try:
        parsed = model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        raise invalid(exc.errors()) from None
    if b"\\u0000" in body and (where := nul_path(orjson.loads(body))) is not None:
        raise AsynchError(Code.INVALID_ARGUMENT, f"{where}: must not contain NUL (\\u0000)")
    return parsed


def nul_path(value: Any, where: str = "") -> str | None:
    """Where in a JSON value a string (or an object key) holds a NUL character."""
    if isinstance(value, str):
        return (where or "body") if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            if "\x00" in key:
                return path.replace("\x00", "\\u0000")
            if (found := nul_path(item, path)) is not None:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            if (found := nul_path(item, f"{where}[{i}]")) is not None:
                return found
    return None


#: what a refused caller must configure (issue 30 item 5)
ADMIN_TOKEN_REQUIRED = (
    "this route needs the admin token: send AIGCQ_ASYNCH_ADMIN_TOKEN as Authorization: Bearer "
    "or X-Admin-Token (`aigcq asynch` generates one at its first start and keeps it as "
    "asynch_admin_token in AIGCQ_DATA_DIR/secrets.json); AIGCQ_ASYNCH_ADMIN_OPEN=true opens "
    "these routes"
)
NO_ADMIN_TOKEN = (
    "no admin token is configured for the management routes: set AIGCQ_ASYNCH_ADMIN_TOKEN, "
    "or AIGCQ_ASYNCH_ADMIN_OPEN=true to open them"
)


def require_admin(request: Request) -> None:
    """The management routes' check: the admin token (``AIGCQ_ASYNCH_ADMIN_TOKEN``) as a
    Bearer token or ``X-Admin-Token``, unless ``AIGCQ_ASYNCH_ADMIN_OPEN`` opens them."""
    settings = service(request).settings
    if settings.admin_open:
        return
    if not settings.admin_token:
        raise AsynchError(Code.UNAUTHORIZED, NO_ADMIN_TOKEN)
    given = request.headers.get("x-admin-token") or bearer(request.headers.get("authorization"))
    if not given or not hmac.compare_digest(given.encode(), settings.admin_token.encode()):
        raise AsynchError(Code.UNAUTHORIZED, ADMIN_TOKEN_REQUIRED)


def invalid(errors: Any) -> AsynchError:
    """``INVALID_ARGUMENT`` naming the first bad field."""
    first = next(iter(errors))
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query"))
    message = first.get("msg", "invalid")
    return AsynchError(Code.INVALID_ARGUMENT, f"{where}: {message}" if where else message)


def validation_error(exc: RequestValidationError) -> AsynchError:
    return invalid(exc.errors())
