"""An S3-compatible bucket (AWS, MinIO, Ceph, R2 …), path-style PUT signed with SigV4."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx

from aigcq.storage.base import Storage, StorageError
from aigcq.storage.sigv4 import authorization


class S3Storage(Storage):
    """PUTs objects to ``{endpoint}/{bucket}/{prefix}{name}``; the URL returned is
    ``{public_url}/{prefix}{name}`` when ``public_url`` is set, else the object URL."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        endpoint: str,
        bucket: str,
        access_key: str,
        secret_key: str,
        region: str = "us-east-1",
        prefix: str = "",
        public_url: str = "",
    ) -> None:
        self.client = client
        self.endpoint = endpoint.rstrip("/")
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region
        self.prefix = prefix
        self.public_url = public_url.rstrip("/")

    async def _put(
        self, name: str, data: bytes, content_type: str, headers: Mapping[str, str]
    ) -> str:
        key = self.prefix + name
        url = f"{self.endpoint}/{self.bucket}/{key}"
        signed = self._signed_headers(url, data, content_type)
        response = await self.client.put(url, content=data, headers=signed)
        if response.status_code >= 300:
            raise StorageError(f"S3 PUT {url}: HTTP {response.status_code} {response.text[:200]}")
        return f"{self.public_url}/{key}" if self.public_url else url

    def owns(self, url: str) -> bool:
        base = self.public_url or f"{self.endpoint}/{self.bucket}"
        return url.startswith(f"{base}/{self.prefix}")

    def _signed_headers(self, url: str, data: bytes, content_type: str) -> dict[str, str]:
        parts = urlsplit(url)
        payload_hash = hashlib.sha256(data).hexdigest()
        now = datetime.now(UTC)
        headers = {
            "host": parts.netloc,
            "content-type": content_type,
            "x-amz-content-sha256": payload_hash,
            "x-amz-date": now.strftime("%Y%m%dT%H%M%SZ"),
        }
        headers["authorization"] = authorization(
            method="PUT",
            path=parts.path,
            query={},
            headers=headers,
            payload_hash=payload_hash,
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=self.region,
            when=now,
        )
        return headers
