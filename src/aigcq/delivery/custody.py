"""Result custody: a paid platform's result files copied into aigcq's storage before the
result is delivered, so a client that comes back after the vendor's links expired (about a
day where a platform's spec says they expire, ``expiring_links``; the outbox keeps results
two) can still fetch them.

Which results (``AIGCQ_RESULT_CUSTODY``): ``offline`` (the default) those of a client that
is not connected when the result comes (:mod:`aigcq.delivery.presence`; a client connected
then gets it at once, while the vendor's links work), ``always`` every one, ``off`` none;
only results of ``AIGCQ_RESULT_CUSTODY_TARGETS``, and only their ``fileUrl`` entries that
are not aigcq's own already. Each file is streamed from the vendor (a result's files at
once, :data:`COPIES_AT_ONCE` per process; at most ``AIGCQ_RESULT_CUSTODY_MAX_BYTES``, within
``AIGCQ_RESULT_CUSTODY_TIMEOUT_S``), stored as ``custody/<keyed task folder>/<n>.<ext>``,
and its entry becomes::

    {"fileUrl": "<signed aigcq link>", "sourceUrl": "<the vendor's>",
     "expiresAt": <the link's expiry, epoch s>, "sourceExpiresAt": <the vendor's, if known>, ...}

A copy that fails (the vendor's link already expired, 403/404, too large, too slow, the
storage refusing) loses nothing: that entry keeps the vendor's ``fileUrl``, gains
``sourceUrl`` and ``custodyError`` (why), and a warning names the task and the file.

The signed links (:mod:`aigcq.wire.links`) are served by serve (``GET /results/…``,
:mod:`aigcq.gateway.result_links`): a local file directly, a file of another storage (S3,
the OSS service) by a redirect to the URL the storage gave, kept in Redis for as long as
the link works.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import mimetypes
import re
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
from redis.asyncio import Redis

from aigcq.config import ResultCustody, Settings
from aigcq.delivery.presence import Presence
from aigcq.domain import TaskState
from aigcq.observability import metrics
from aigcq.observability.jsonlog import ctx
from aigcq.platforms.registry import spec_of
from aigcq.plumbing.text import text
from aigcq.queue.keys import Keys
from aigcq.storage import Storage, StorageError
from aigcq.storage.local import LocalStorage
from aigcq.wire.links import FOLDER, link_key, signed_url

log = logging.getLogger(__name__)

#: result files downloaded at once by one process
COPIES_AT_ONCE = 8
#: how often a serve process deletes local copies whose links have expired
SWEEP_S = 600.0
#: a task in one of these states takes no result any more
ENDED = frozenset(s.value for s in TaskState if s.terminal)


def keeps_results_of(settings: Settings, target: str) -> bool:
    """Whether results of ``target`` may have their files copied: custody is on, and the
    target is one of ``AIGCQ_RESULT_CUSTODY_TARGETS``, by default a platform whose spec says
    its links expire."""
    if settings.result_custody is ResultCustody.OFF:
        return False
    if settings.result_custody_targets is not None:
        return target in settings.result_custody_targets
    spec = spec_of(target)
    return spec is not None and spec.expiring_links


class CopyFailed(Exception):
    """A result file could not be copied; the message says why."""


class Custody:
    def __init__(self, settings: Settings, storage: Storage, redis: Redis, keys: Keys) -> None:
        self.settings = settings
        self.storage = storage
        self.redis = redis
        self.keys = keys
        self.presence = Presence(redis, keys)
        #: keys the folder names of copies, so a task id alone cannot find them; with no
        #: signing key (serve does not start then) nothing is copied
        self.folder_key = settings.signing_key()
        #: signs the copies' links (:mod:`aigcq.wire.links`)
        self.link_key = link_key(self.folder_key) if self.folder_key else b""
        self._copies = asyncio.Semaphore(COPIES_AT_ONCE)
        self._http: httpx.AsyncClient | None = None

    @property
    def http(self) -> httpx.AsyncClient:
        """Made lazily, inside the running event loop."""
        if self._http is None:
            timeout = httpx.Timeout(self.settings.http_timeout_s)
            self._http = httpx.AsyncClient(timeout=timeout, follow_redirects=True)
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    async def kept(self, task_id: str, target: str, result: Any) -> Any:
        """``result`` (a success's answer) with its files in custody when the rules want
        them there, else as it is. ``target``: the task's, or ``""`` when not known."""
        entries = _file_entries(result) if self.link_key else []
        if not entries or (target and not keeps_results_of(self.settings, target)):
            return result
        if not any(self._foreign(e["fileUrl"]) for e in entries):
            return result
        target = await self._wanted(task_id, target)
        if not target:
            return result
        folder = hmac.new(self.folder_key, task_id.encode(), hashlib.sha256).hexdigest()[:32]
        copied = await asyncio.gather(
            *(
                self._entry(task_id, target, f"{FOLDER}/{folder}/{i}", e)
                for i, e in enumerate(entries)
            )
        )
        kept = sum("expiresAt" in e for e in copied)
        log.debug(
            "task %s: %d of %d result files copied",
            task_id,
            kept,
            len(copied),
            extra=ctx(task=task_id),
        )
        return _with_entries(result, list(copied))

    def _foreign(self, url: Any) -> bool:
        """Whether ``url`` is a vendor's link (http or https, not to aigcq's own files: a
        copy, or a file a platform sent inline and the storage keeps already)."""
        return (
            isinstance(url, str)
            and url.startswith(("http://", "https://"))
            and not url.startswith(self.public_base + "/")
            and not self.storage.owns(url)
        )

    @property
    def public_base(self) -> str:
        """The base of the copies' links: serve's public URL (read when used: a test sets
        it once its port is known)."""
        return self.settings.public_callback_base()

    async def _wanted(self, task_id: str, target: str) -> str:
        """The task's target when its result is to be copied now, else ``""``."""
        fields = ["status", "target", "backendId", "deliver"]
        raw = await self.redis.hmget(self.keys.task(task_id), fields)
        status, found, backend_id, deliver = (text(v) if v is not None else "" for v in raw)
        if status in ENDED or not keeps_results_of(self.settings, found or target):
            return ""  # over already (finish will refuse this result), or not a custody target
        if self.settings.result_custody is ResultCustody.ALWAYS:
            return found or target
        if deliver != "1" or await self.presence.online(backend_id):
            return ""  # nobody waits for it offline
        return found or target

    async def _entry(self, task_id: str, target: str, stem: str, entry: dict[str, Any]) -> Any:
        source = entry["fileUrl"]
        if not self._foreign(source):
            return entry
        source_expiry = expiry_of(source)
        known = {"sourceExpiresAt": source_expiry} if source_expiry is not None else {}
        try:
            url, expires = await self._copy(stem, source, entry.get("fileType"))
        except CopyFailed as exc:
            metrics.result_file_copied(target, ok=False)
            log.warning(
                "task %s: result file %s not copied (%s); delivered with the vendor's link %s",
                task_id,
                stem.rsplit("/", 1)[-1],
                exc,
                source,
                extra=ctx(task=task_id),
            )
            return {**entry, "sourceUrl": source, "custodyError": str(exc), **known}
        metrics.result_file_copied(target, ok=True)
        return {**entry, "fileUrl": url, "sourceUrl": source, "expiresAt": expires, **known}

    async def _copy(self, stem: str, source: str, file_type: Any) -> tuple[str, int]:
        """Copy ``source`` to the storage: its signed link and the link's expiry."""
        async with self._copies:
            try:
                async with asyncio.timeout(self.settings.result_custody_timeout_s):
                    data, content_type = await self._download(source)
            except TimeoutError as exc:
                raise CopyFailed("timed out") from exc
        name = f"{stem}.{_extension(file_type, source, content_type)}"
        expires = int(time.time() + self.settings.result_link_ttl_s)
        try:
            stored = await self.storage.put(name, data, content_type)
        except StorageError as exc:
            raise CopyFailed(f"storage: {exc}") from exc
        if not isinstance(self.storage, LocalStorage):
            ttl = self.settings.result_link_ttl_s
            await self.redis.set(self.keys.custody_file(name), stored, ex=ttl)
        return signed_url(self.public_base, self.link_key, name, expires), expires

    async def _download(self, url: str) -> tuple[bytes, str]:
        limit = self.settings.result_custody_max_bytes
        try:
            async with self.http.stream("GET", url) as response:
                if response.status_code != 200:
                    raise CopyFailed(f"HTTP {response.status_code}")
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > limit:
                    raise CopyFailed(f"{declared} bytes, over {limit}")
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > limit:
                        raise CopyFailed(f"over {limit} bytes")
                    chunks.append(chunk)
                content_type = response.headers.get("content-type", "").split(";")[0].strip()
        except httpx.HTTPError as exc:
            raise CopyFailed(f"{type(exc).__name__}: {exc}") from exc
        return b"".join(chunks), content_type or "application/octet-stream"

    async def stored_url(self, name: str) -> str | None:
        """Where a copy kept in a storage serve does not read itself is (None: unknown)."""
        found = await self.redis.get(self.keys.custody_file(name))
        return text(found) if found is not None else None

    async def sweep(self) -> int:
        """Delete local copies whose links have expired; how many went. (A bucket's own
        lifecycle rule on ``custody/`` does that for S3 and the OSS service.)"""
        storage = self.storage
        if not isinstance(storage, LocalStorage):
            return 0
        before = time.time() - self.settings.result_link_ttl_s
        removed = await storage.remove_older(FOLDER, before)
        if removed:
            log.info("result custody: %d copies past their links' expiry deleted", removed)
        return removed


def _file_entries(result: Any) -> list[dict[str, Any]]:
    """The entries of a result in RunningHub's ``/outputs`` shape (``data`` a list, or the
    list under ``data["data"]``, as adapters give files) that have a ``fileUrl``; [] for
    another shape."""
    listed = result.get("data") if isinstance(result, dict) else result
    if not isinstance(listed, list):
        return []
    return [e for e in listed if isinstance(e, dict) and isinstance(e.get("fileUrl"), str)]


def _with_entries(result: Any, copied: list[Any]) -> Any:
    """``result`` with its ``fileUrl`` entries replaced, in order, by ``copied``."""
    replaced = iter(copied)
    listed: list[Any] = result["data"] if isinstance(result, dict) else result
    entries = [
        next(replaced) if isinstance(e, dict) and isinstance(e.get("fileUrl"), str) else e
        for e in listed
    ]
    return {**result, "data": entries} if isinstance(result, dict) else entries


_EXTENSION = re.compile(r"^[A-Za-z0-9]{1,8}$")


def _extension(file_type: Any, url: str, content_type: str) -> str:
    """The copy's extension: the entry's ``fileType``, else the URL's, else the type's."""
    candidates = [
        str(file_type or ""),
        urlsplit(url).path.rsplit("/", 1)[-1].rpartition(".")[2],
        (mimetypes.guess_extension(content_type) or "").lstrip("."),
    ]
    return next((c.lower() for c in candidates if _EXTENSION.match(c)), "bin")


def expiry_of(url: str) -> int | None:
    """When a vendor's signed link expires (epoch s), from its query, where it says:
    ``x-expires`` (ByteDance's CDN) or ``Expires`` (Alibaba OSS, CloudFront) as a time,
    ``X-Amz-Date``/``X-Tos-Date`` + ``…-Expires`` (S3, Volcengine TOS presigned),
    ``q-sign-time=<start>;<end>`` (Tencent COS); else None."""
    query = {k.lower(): v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    for field in ("x-expires", "expires"):
        if query.get(field, "").isdigit():
            return int(query[field])
    for vendor in ("amz", "tos"):
        date, seconds = query.get(f"x-{vendor}-date", ""), query.get(f"x-{vendor}-expires", "")
        if seconds.isdigit():
            try:
                signed = datetime.strptime(date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
            except ValueError:
                continue
            return int(signed.timestamp()) + int(seconds)
    end = query.get("q-sign-time", "").partition(";")[2]
    return int(end) if end.isdigit() else None
