"""Which storage backend to use, from ``AIGCQ_STORAGE_*``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import httpx
from pydantic_settings import BaseSettings, SettingsConfigDict

from aigcq.storage.base import Storage
from aigcq.storage.local import LocalStorage
from aigcq.storage.oss import OssStorage
from aigcq.storage.s3 import S3Storage


class StorageSettings(BaseSettings):
    """``kind`` picks the backend; the other fields belong to one backend each.

    ``local_dir`` empty means ``<data_dir>/files``; ``public_url`` empty means the owning
    application's own ``/files`` route.
    """

    model_config = SettingsConfigDict(env_prefix="AIGCQ_STORAGE_", env_file=".env", extra="ignore")

    kind: Literal["local", "s3", "oss"] = "local"
    local_dir: Path | None = None
    public_url: str = ""
    oss_url: str = ""
    s3_endpoint: str = ""
    s3_bucket: str = ""
    s3_region: str = "us-east-1"
    s3_access_key: str = ""
    s3_secret_key: str = ""
    s3_prefix: str = ""


def build_storage(
    settings: StorageSettings, client: httpx.AsyncClient, *, default_dir: Path, default_url: str
) -> Storage:
    """The configured backend; local files go to ``default_dir`` unless ``local_dir`` is set."""
    if settings.kind == "oss":
        if not settings.oss_url:
            raise ValueError("AIGCQ_STORAGE_OSS_URL is required for kind=oss")
        return OssStorage(client, settings.oss_url)
    if settings.kind == "s3":
        if not (settings.s3_endpoint and settings.s3_bucket):
            raise ValueError("AIGCQ_STORAGE_S3_ENDPOINT and AIGCQ_STORAGE_S3_BUCKET are required")
        return S3Storage(
            client,
            endpoint=settings.s3_endpoint,
            bucket=settings.s3_bucket,
            access_key=settings.s3_access_key,
            secret_key=settings.s3_secret_key,
            region=settings.s3_region,
            prefix=settings.s3_prefix,
            public_url=settings.public_url,
        )
    return LocalStorage(settings.local_dir or default_dir, settings.public_url or default_url)
