"""``/docs`` served from the package: Swagger UI's script and style come from the
``fastapi-offline`` wheel, not a CDN, so the page works on a machine without Internet.

And the OpenAPI document says what the API really answers: a request FastAPI cannot
validate (``?limit=abc``) gets aigcq's error envelope with 400 ``JSONError``, like every
other bad input, so FastAPI's 422 is neither returned nor listed."""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

ASSETS = "/docs/assets"
_TYPES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon.png": "image/png",
}


def offline_docs(app: FastAPI) -> None:
    """Add ``/docs`` and its assets to ``app`` (built with ``docs_url=None``)."""

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
        )

    @app.get(ASSETS + "/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in _TYPES:
            raise HTTPException(404)
        data = (resources.files("fastapi_offline") / "static" / name).read_bytes()
        return Response(data, media_type=_TYPES[name], headers={"Cache-Control": "max-age=86400"})


def without_422(app: FastAPI) -> None:
    """The OpenAPI document without the 422s FastAPI lists by default (bad input is
    answered 400 ``JSONError``: :func:`aigcq.gateway.errors.as_client_error`)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()  # also cached in app.openapi_schema
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    responses = operation.get("responses", {})
                    if "HTTPValidationError" in str(responses.get("422")):
                        del responses["422"]
            schemas = schema.get("components", {}).get("schemas", {})
            schemas.pop("HTTPValidationError", None)
            schemas.pop("ValidationError", None)
        return app.openapi_schema or build()

    app.openapi = openapi  # type: ignore[method-assign]
