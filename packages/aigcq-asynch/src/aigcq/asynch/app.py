"""The asynch FastAPI application."""

from __future__ import annotations

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse
from starlette.exceptions import HTTPException

from aigcq.asynch.api_models import router as model_router
from aigcq.asynch.api_tasks import router as task_router
from aigcq.asynch.envelope import ErrorEnvelope
from aigcq.asynch.errors import AsynchError, Code
from aigcq.asynch.fastpath import TaskFastPath
from aigcq.asynch.http import error_response, reply, service, validation_error
from aigcq.asynch.metrics import asynch_state
from aigcq.asynch.openapi import document
from aigcq.asynch.overview import overview_router
from aigcq.asynch.process import AsynchProcess
from aigcq.observability.metrics import endpoint
from aigcq.storage import StorageError


def create_app(
    svc: AsynchProcess | None = None, admin_token: str = "", metrics_token: str = ""
) -> FastAPI:
    """The HTTP API over an opened service; the caller owns the service's lifetime and may
    attach it later (``app.state.asynch = svc``), e.g. once the app's own URL is known.
    ``admin_token`` guards the dashboard's read-only ``/admin/overview``, ``metrics_token``
    ``/metrics``."""
    app = FastAPI(title="aigcq asynch", docs_url="/docs", redoc_url=None)
    app.state.asynch = svc
    app.include_router(model_router)
    app.include_router(task_router)
    app.add_middleware(TaskFastPath)  # the hot task endpoints, same handlers, fewer layers
    app.add_middleware(ErrorEnvelope)  # outermost: every error in the envelope
    app.include_router(overview_router(admin_token))
    scrape = endpoint(asynch_state(app), token=metrics_token)
    app.add_route("/metrics", scrape, include_in_schema=False)

    @app.exception_handler(AsynchError)
    async def _asynch_error(request: Request, exc: AsynchError) -> Response:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        return error_response(validation_error(exc))

    @app.exception_handler(HTTPException)
    async def _routing_error(request: Request, exc: HTTPException) -> Response:
        """No such endpoint, or not with this method: in the API's envelope too."""
        path = request.url.path
        if exc.status_code not in (404, 405):
            code = Code.INVALID_ARGUMENT if exc.status_code == 400 else Code.INTERNAL_ERROR
            error = AsynchError(code, str(exc.detail))
            response = error_response(error)
            response.status_code = exc.status_code
            return response
        if exc.status_code == 405:
            error = AsynchError(Code.METHOD_NOT_ALLOWED, f"{path} does not take {request.method}")
        else:
            error = AsynchError(Code.NOT_FOUND, f"no endpoint {path}")
        response = error_response(error)
        response.headers.update(exc.headers or {})
        return response

    @app.get("/healthz")  # as every aigcq process answers
    @app.get("/health")
    async def health() -> Response:
        return reply({"status": "ok"})

    @app.get("/files/{name:path}")
    async def files(request: Request, name: str) -> Response:
        local = service(request).local_files
        try:
            path = local.path_of(name) if local else None
            found = path is not None and path.is_file()
        except (StorageError, ValueError):  # ValueError: a NUL in the name
            path, found = None, False
        if path is None or not found:
            return error_response(AsynchError(Code.FILE_NOT_FOUND, f"no file {name!r}"))
        return FileResponse(path)

    document(app)
    return app
