"""Where ``aigcq serve`` keeps result files a platform sends inline (an adapter's
``Succeeded.files``), and the ``GET /files/{name}`` route that serves them.

The backend is chosen by ``AIGCQ_STORAGE_*`` (:class:`aigcq.storage.StorageSettings`), as
for model-asynch: by default a folder ``<data_dir>/files`` served by serve itself at
``<public callback base>/files``; with ``kind=s3``/``oss`` the files go to that service
and its URLs are handed out instead.
"""

from __future__ import annotations

import httpx
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from aigcq.config import Settings
from aigcq.storage import Storage, StorageError, StorageSettings, build_storage
from aigcq.storage.local import LocalStorage
from aigcq.wire.links import FOLDER as CUSTODY_FOLDER
from aigcq.wire.links import INPUTS_FOLDER


def result_storage(settings: Settings, storage: StorageSettings | None = None) -> Storage:
    # only S3 and the OSS service use the client; the process keeps it to its end
    return build_storage(
        storage or StorageSettings(),
        httpx.AsyncClient(timeout=settings.http_timeout_s),
        default_dir=settings.data_dir / "files",
        default_url=f"{settings.public_callback_base()}/files",
    )


def files_route(storage: Storage | None) -> Route:
    """``GET /files/{name}``: a file of the local folder (404 for anything else, for
    copies of result custody: those are served only behind their signed links, and for
    uploaded inputs: those only to their owner and to bridges)."""

    async def files(request: Request) -> Response:
        path = None
        if isinstance(storage, LocalStorage) and not request.path_params["name"].startswith(
            (f"{CUSTODY_FOLDER}/", f"{INPUTS_FOLDER}/")
        ):
            try:
                path = storage.path_of(request.path_params["name"])
            except StorageError:
                path = None
        if path is None or not path.is_file():
            return JSONResponse({"detail": "not found"}, 404)
        return FileResponse(path)

    return Route("/files/{name:path}", files, methods=["GET"])
