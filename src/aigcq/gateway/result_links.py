"""``GET /results/{expires}-{signature}/{name}``: a copied result file, behind its signed link
(:mod:`aigcq.wire.links`, :mod:`aigcq.delivery.custody`).

A link whose signature does not match is refused ``SignatureError`` (403), one past its
expiry ``LinkExpired`` (410), a file no longer kept ``FileNotFound`` (404). A valid link
serves the local file, or redirects (307) to where another storage keeps it.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from aigcq.config import Messages
from aigcq.delivery.custody import Custody
from aigcq.domain import ErrorCode
from aigcq.gateway.errors import ClientError
from aigcq.storage import StorageError
from aigcq.storage.local import LocalStorage
from aigcq.wire.links import EXPIRED, FOLDER, ROUTE, refusal


def result_links_route(custody: Custody, messages: Messages) -> Route:
    async def serve(request: Request) -> Response:
        try:
            return await _file(custody, request.path_params["token"], request.path_params["name"])
        except ClientError as exc:
            return JSONResponse(exc.body(messages), exc.status)

    return Route(f"{ROUTE}/{{token}}/{{name:path}}", serve, methods=["GET"])


async def _file(custody: Custody, token: str, name: str) -> Response:
    refused = refusal(custody.link_key, token, name, time.time()) if custody.link_key else "off"
    if refused == EXPIRED:
        raise ClientError(ErrorCode.LINK_EXPIRED, "this link has expired")
    if refused is not None or not name.startswith(f"{FOLDER}/"):
        raise ClientError(ErrorCode.SIGNATURE, "bad link signature")
    storage = custody.storage
    if isinstance(storage, LocalStorage):
        try:
            path = storage.path_of(name)
        except StorageError as exc:
            raise ClientError(ErrorCode.FILE_NOT_FOUND, "no such file") from exc
        if not path.is_file():
            raise ClientError(ErrorCode.FILE_NOT_FOUND, "no longer kept")
        return FileResponse(path)
    url = await custody.stored_url(name)
    if url is None:
        raise ClientError(ErrorCode.FILE_NOT_FOUND, "no longer kept")
    return RedirectResponse(url, 307)
