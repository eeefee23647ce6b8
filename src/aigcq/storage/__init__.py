"""Result file storage: a local folder served over HTTP (default), an S3-compatible bucket,
or the seed's HTTP OSS service. All behind :class:`Storage`."""

from aigcq.storage.base import Storage, StorageError
from aigcq.storage.settings import StorageSettings, build_storage

__all__ = ["Storage", "StorageError", "StorageSettings", "build_storage"]
