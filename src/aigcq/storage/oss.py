"""The seed's HTTP OSS file service: ``POST {base}/oss/file/uploadFile`` (multipart ``file``).

The caller's ``Authorization`` and ``X-User-Info`` headers are passed through. The file URL is
read from the JSON answer: ``data.url``, ``data.fileUrl``, ``data`` (a string) or ``url``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from aigcq.storage.base import Storage, StorageError

FORWARDED = ("authorization", "x-user-info")


class OssStorage(Storage):
    def __init__(self, client: httpx.AsyncClient, base_url: str) -> None:
        self.client = client
        self.base_url = base_url.rstrip("/")
        self.upload_url = f"{self.base_url}/oss/file/uploadFile"

    def owns(self, url: str) -> bool:
        """A URL of the service itself (the one it hands out may name another host)."""
        return url.startswith(self.base_url + "/")

    async def _put(
        self, name: str, data: bytes, content_type: str, headers: Mapping[str, str]
    ) -> str:
        forwarded = {k: v for k, v in headers.items() if k.lower() in FORWARDED and v}
        files = {"file": (name.rsplit("/", 1)[-1], data, content_type)}
        try:
            response = await self.client.post(self.upload_url, files=files, headers=forwarded)
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise StorageError(f"OSS upload to {self.upload_url}: {exc!r}") from exc
        url = _file_url(body)
        if response.status_code >= 300 or url is None:
            raise StorageError(
                f"OSS upload to {self.upload_url}: HTTP {response.status_code} {str(body)[:200]}"
            )
        return url


def _file_url(body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    data = body.get("data")
    if isinstance(data, str) and data:
        return data
    if isinstance(data, dict):
        for key in ("url", "fileUrl", "file_url"):
            if isinstance(data.get(key), str) and data[key]:
                return str(data[key])
    url = body.get("url")
    return url if isinstance(url, str) and url else None
