"""Comfy API v2 uploaded assets: workflow inputs a client sends before its job, by content.

``comfy-sdk`` commits each ``client.assets.from_*`` handle at submit: ``HEAD
/api/v2/assets/by-hash/blake3:<hex>`` (200: this caller has those bytes), then ``POST
/api/v2/assets/from-hash`` on a hit, a multipart ``POST /api/v2/assets`` on a miss; the graph
then carries ``{"__type": "core/ASSET", "info": {"id", "hash", "file_path"}}`` where a
filename would go (a ``LoadImage``'s ``image``, say).

What is kept:

* the bytes once per content, whoever uploaded them: ``inputs/<hex>`` in aigcq's storage
  (``AIGCQ_STORAGE_*``), with ``{prefix}:v2:blob:<hex>`` (its URL, size, type);
* per caller (the token's backendId) an asset record ``{prefix}:v2:asset:<uuid>`` and its
  index by content ``{prefix}:v2:owned:<owner>:<hex>`` (a caller learns nothing of what
  others uploaded: another's bytes are a miss, as the spec wants).

Each lives ``AIGCQ_RESULT_RETENTION_S`` (as outputs do) from its last use: an upload, a
``from-hash``, a job naming it. Local files whose record has gone are deleted by
:meth:`Assets.sweep`; a bucket's lifecycle rule on ``inputs/`` does that for S3 / OSS.

A job's graph keeps its ``core/ASSET`` references, checked and completed at submit (the
caller's asset, its server-side hash); the bridge that runs it fetches each one by hash
(``GET /api/inputs/blake3:<hex>``, bridge token), uploads it to the ComfyUI instance
chosen (``/upload/image``) and puts the name ComfyUI gave in its place
(:mod:`aigcq.agent.inputs`).
"""

from __future__ import annotations

import asyncio
import logging
import mimetypes
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import blake3
import orjson
from fastapi import Request
from fastapi.responses import FileResponse, RedirectResponse, Response

from aigcq.gateway.v2_errors import V2Error
from aigcq.plumbing.asgi_body import request_body
from aigcq.plumbing.http_body import BodyTooLarge, Disconnected
from aigcq.plumbing.multipart import MalformedMultipart, Part, parse
from aigcq.plumbing.text import text
from aigcq.runtime import Runtime
from aigcq.storage import Storage, StorageError
from aigcq.storage.local import LocalStorage
from aigcq.wire.assets import ASSET_TYPE, asset_refs, digest_hex, replace_assets
from aigcq.wire.links import INPUTS_FOLDER

log = logging.getLogger(__name__)

#: the storage folder of uploaded inputs (``inputs/<hex>``), never served by ``/files``
FOLDER = INPUTS_FOLDER
#: what a multipart body may carry besides its file (its fields and part headers)
FIELDS_ALLOWANCE = 64 * 1024
_MAX_FILE_PATH = 1024

Reads = Callable[[str], bool]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def _checked_file_path(value: str | None) -> str:
    """The client's name for the file: relative, no ``..``, printable (a name only: aigcq
    never uses it as a path; the bridge keeps its extension)."""
    if not value:
        raise V2Error(422, "invalid_request", "file_path: the file's name is required")
    if (
        len(value) > _MAX_FILE_PATH
        or not value.isprintable()
        or value.startswith("/")
        or "\\" in value
        or any(p in ("", ".", "..") for p in value.split("/"))
    ):
        raise V2Error(
            422, "invalid_request", "file_path: a relative name without '..' (at most 1024 chars)"
        )
    return value


class Assets:
    """Uploads, look-ups by content and the references of jobs' graphs."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        storage = rt.platforms.storage
        assert storage is not None  # runtime() always gives the platforms one
        self.storage: Storage = storage

    # -- keys ---------------------------------------------------------------------------
    def _asset_key(self, asset_id: str) -> str:
        return f"{self.rt.store.keys.prefix}:v2:asset:{asset_id}"

    def _owned_key(self, owner: str, hex_: str) -> str:
        return f"{self.rt.store.keys.prefix}:v2:owned:{owner}:{hex_}"

    def _blob_key(self, hex_: str) -> str:
        return f"{self.rt.store.keys.prefix}:v2:blob:{hex_}"

    @property
    def ttl(self) -> int:
        return max(self.rt.settings.result_retention_s, 60)

    @property
    def max_bytes(self) -> int:
        return self.rt.settings.comfy_v2_max_upload_bytes

    # -- records -------------------------------------------------------------------------
    async def record(self, asset_id: str, reads: Reads) -> dict[str, str] | None:
        """The asset ``asset_id`` if the caller may read it."""
        try:
            uuid.UUID(asset_id)
        except ValueError:
            return None
        raw = await self.rt.store.mux.command("HGETALL", self._asset_key(asset_id))
        found = {text(k): text(v) for k, v in zip(raw[::2], raw[1::2], strict=True)}
        if "hex" not in found or not reads(found.get("owner", "")):  # none, or a stray touch
            return None
        return found

    async def _owned(self, owner: str, hex_: str) -> dict[str, str] | None:
        asset_id = await self.rt.store.mux.command("GET", self._owned_key(owner, hex_))
        if asset_id is None:
            return None
        return await self.record(text(asset_id), lambda o: o == owner)

    def view(self, record: dict[str, str], base: str, created_new: bool | None) -> dict[str, Any]:
        """An asset as the spec's ``Asset``."""
        expires = float(record["touched"]) + self.ttl
        body: dict[str, Any] = {
            "id": record["id"],
            "hash": f"blake3:{record['hex']}",
            "size_bytes": int(record["size"]),
            "content_type": record["content_type"],
            "file_path": record["file_path"],
            "created_at": _iso(float(record["created"])),
            "url": f"{base}/api/v2/assets/{record['id']}/content",
            "url_expires_at": _iso(expires),
            "expires_at": _iso(expires),
        }
        if created_new is not None:
            body["created_new"] = created_new
        return body

    async def _touch(self, records: list[dict[str, str]]) -> None:
        """Each asset (its record, its owner's index, its bytes) lives a retention from now."""
        now = str(time.time())
        pipe = self.rt.redis.pipeline(transaction=False)
        for record in records:
            key = self._asset_key(record["id"])
            pipe.hset(key, "touched", now)
            pipe.expire(key, self.ttl)
            pipe.expire(self._owned_key(record["owner"], record["hex"]), self.ttl)
            pipe.expire(self._blob_key(record["hex"]), self.ttl + 3600)
            record["touched"] = now
        await pipe.execute()

    async def _create(
        self, owner: str, hex_: str, size: int, content_type: str, file_path: str
    ) -> tuple[dict[str, str], bool]:
        """The owner's asset of these bytes: a new one (True), or the one it had (False)."""
        asset_id = str(uuid.uuid4())
        owned = self._owned_key(owner, hex_)
        if not await self.rt.redis.set(owned, asset_id, nx=True, ex=self.ttl):
            existing = await self._owned(owner, hex_)
            if existing is not None:
                await self._touch([existing])
                return existing, False
            await self.rt.redis.set(owned, asset_id, ex=self.ttl)
        now = str(time.time())
        record: dict[str, str] = {
            "id": asset_id,
            "owner": owner,
            "hex": hex_,
            "size": str(size),
            "content_type": content_type,
            "file_path": file_path,
            "created": now,
            "touched": now,
        }
        pipe = self.rt.redis.pipeline(transaction=True)
        pipe.hset(self._asset_key(asset_id), mapping={k: v for k, v in record.items()})
        pipe.expire(self._asset_key(asset_id), self.ttl)
        pipe.expire(self._blob_key(hex_), self.ttl + 3600)
        await pipe.execute()
        return record, True

    # -- the routes' work ----------------------------------------------------------------
    async def known(self, digest: str, owner: str) -> bool:
        """``HEAD by-hash``: whether the caller has an asset of these bytes, and they are
        still stored (bytes a storage rule or a sweep took: no, so the client uploads them
        again rather than naming bytes its job would not find)."""
        hex_ = digest_hex(digest)
        if hex_ is None:
            raise V2Error(400, "invalid_request", "the hash must be blake3:<64 hex digits>")
        return await self._owned(owner, hex_) is not None and self._present(hex_)

    async def from_hash(self, request: Request, owner: str) -> dict[str, str]:
        """``POST from-hash {hash, file_path?}``: the caller's asset of bytes it uploaded."""
        try:  # bounded, as every other body: a hash and a name
            body = orjson.loads(await request_body(request, FIELDS_ALLOWANCE))
        except BodyTooLarge as exc:
            raise V2Error(413, "payload_too_large", "from-hash takes a hash and a name") from exc
        except Disconnected as exc:
            raise V2Error(400, "invalid_request", "the request body did not arrive") from exc
        except orjson.JSONDecodeError as exc:
            raise V2Error(400, "invalid_request", "the body must be JSON") from exc
        if not isinstance(body, dict):
            raise V2Error(400, "invalid_request", "the body must be a JSON object")
        hex_ = digest_hex(body.get("hash"))
        if hex_ is None:
            raise V2Error(422, "invalid_request", "hash: blake3:<64 hex digits>")
        file_path = body.get("file_path")
        if file_path is not None and not isinstance(file_path, str):
            raise V2Error(422, "invalid_request", "file_path: a string")
        record = await self._owned(owner, hex_)
        stored = await self.rt.redis.exists(self._blob_key(hex_)) and self._present(hex_)
        if record is None or not stored:
            raise V2Error(404, "blob_not_found", "no bytes of that hash this caller may use")
        await self._touch([record])
        return record

    async def upload(self, request: Request, owner: str) -> tuple[dict[str, str], bool]:
        """Multipart ``POST /api/v2/assets`` (``file``, ``file_path``, ``content_type``?,
        ``expected_hash``?, ``tags``*): the asset, and whether it is new to the caller."""
        content_type = request.headers.get("content-type", "")
        if not content_type.lower().startswith("multipart/form-data"):
            raise V2Error(400, "invalid_request", "expected a multipart/form-data body")
        try:
            body = await request_body(request, self.max_bytes + FIELDS_ALLOWANCE)
        except BodyTooLarge as exc:
            raise self._too_large() from exc
        except Disconnected as exc:
            raise V2Error(400, "invalid_request", "the request body did not arrive") from exc
        try:
            parts = parse(body, content_type)
            file, fields = _form(parts)
        except MalformedMultipart as exc:
            raise V2Error(400, "invalid_request", f"malformed multipart body: {exc}") from exc
        del body
        if len(file.data) > self.max_bytes:
            raise self._too_large()
        file_path = _checked_file_path(fields.get("file_path"))
        hex_ = await _blake3(file.data)
        expected = fields.get("expected_hash")
        if expected and digest_hex(expected) != hex_:
            raise V2Error(
                409,
                "hash_mismatch",
                "expected_hash does not match the bytes received",
                {"expected_hash": expected, "hash": f"blake3:{hex_}"},
            )
        media = (
            fields.get("content_type")
            or file.content_type
            or mimetypes.guess_type(file_path)[0]
            or "application/octet-stream"
        )
        await self._store(hex_, file.data, media)
        return await self._create(owner, hex_, len(file.data), media, file_path)

    def _too_large(self) -> V2Error:
        return V2Error(
            413,
            "payload_too_large",
            f"an upload is at most {self.max_bytes} bytes (AIGCQ_COMFY_V2_MAX_UPLOAD_BYTES)",
            {"max_bytes": self.max_bytes},
        )

    async def _store(self, hex_: str, data: bytes, media: str) -> None:
        """The bytes into storage, once per content."""
        key = self._blob_key(hex_)
        if await self.rt.redis.exists(key) and self._present(hex_):
            await self.rt.redis.expire(key, self.ttl + 3600)
            return
        try:
            url = await self.storage.put(f"{FOLDER}/{hex_}", data, media)
        except StorageError as exc:
            raise V2Error(503, "storage_unavailable", f"the upload was not stored: {exc}") from exc
        pipe = self.rt.redis.pipeline(transaction=True)
        pipe.hset(key, mapping={"url": url, "size": str(len(data)), "content_type": media})
        pipe.expire(key, self.ttl + 3600)
        await pipe.execute()

    def _present(self, hex_: str) -> bool:
        """Whether the stored bytes are there (a local file; another storage: assumed)."""
        if isinstance(self.storage, LocalStorage):
            return self.storage.path_of(f"{FOLDER}/{hex_}").is_file()
        return True

    async def delete(self, asset_id: str, reads: Reads) -> None:
        """The caller's asset goes; its bytes stay for their retention (another asset, a job
        waiting for a bridge may name them)."""
        record = await self.record(asset_id, reads)
        if record is None:
            raise V2Error(404, "asset_not_found", f"no asset {asset_id!r}")
        pipe = self.rt.redis.pipeline(transaction=True)
        pipe.delete(self._asset_key(asset_id))
        pipe.delete(self._owned_key(record["owner"], record["hex"]))
        await pipe.execute()

    async def content(self, asset_id: str, reads: Reads) -> Response:
        """An uploaded asset's bytes (a local file with ``Range``; else a redirect)."""
        record = await self.record(asset_id, reads)
        if record is None:
            raise V2Error(404, "asset_not_found", f"no asset {asset_id!r}")
        return await self._bytes(record["hex"], record["content_type"])

    async def _bytes(self, hex_: str, media: str | None) -> Response:
        name = f"{FOLDER}/{hex_}"
        if isinstance(self.storage, LocalStorage):
            path = self.storage.path_of(name)
            if not path.is_file():
                raise V2Error(404, "asset_not_found", "its bytes are gone")
            return FileResponse(path, media_type=media or "application/octet-stream")
        url = await self.rt.redis.hget(self._blob_key(hex_), "url")
        if url is None:
            raise V2Error(404, "asset_not_found", "its bytes are gone")
        return RedirectResponse(text(url), 307)

    async def for_bridge(self, digest: str) -> Response:
        """A bridge's fetch of an input by content (``GET /api/inputs/blake3:<hex>``)."""
        hex_ = digest_hex(digest)
        if hex_ is None:
            raise V2Error(404, "asset_not_found", "no such input")
        media = await self.rt.redis.hget(self._blob_key(hex_), "content_type")
        return await self._bytes(hex_, None if media is None else text(media))

    # -- jobs' graphs -------------------------------------------------------------------
    async def resolve(self, graph: dict[str, Any], owner: str, reads: Reads) -> dict[str, Any]:
        """``graph`` with each ``core/ASSET`` reference checked (an asset the caller may
        read, by ``id``; else its own, by ``hash``) and completed (its id, server-side hash,
        file_path); a reference that names none: ``422 missing_asset``. The assets named live a
        retention from now (a job waiting that long may still be run)."""
        refs = asset_refs(graph)
        if not refs:
            return graph
        # every reference at once: the store's mux sends their reads in one write
        records = await asyncio.gather(*(self._referenced(ref, owner, reads) for ref in refs))
        missing = [_named(ref) for ref, record in zip(refs, records, strict=True) if not record]
        if missing:
            raise V2Error(
                422,
                "missing_asset",
                f"core/ASSET references name no asset of yours: {', '.join(missing)}",
                {"missing_ids": missing},
            )
        found = {id(ref): record for ref, record in zip(refs, records, strict=True) if record}
        await self._touch(list({r["id"]: r for r in found.values()}.values()))
        resolved: dict[str, Any] = replace_assets(graph, lambda ref: _completed(found[id(ref)]))
        return resolved

    async def _referenced(
        self, ref: dict[str, Any], owner: str, reads: Reads
    ) -> dict[str, str] | None:
        """The asset a reference names: by ``id`` one the caller may read, else by
        ``hash`` the caller's own (None: none)."""
        info = ref.get("info")
        if not isinstance(info, dict):
            return None
        if isinstance(info.get("id"), str):
            return await self.record(info["id"], reads)
        if (hex_ := digest_hex(info.get("hash"))) is not None:
            return await self._owned(owner, hex_)
        return None

    # -- retention ----------------------------------------------------------------------
    async def sweep(self) -> int:
        """Delete the local files of bytes no asset named for a retention; how many went."""
        if not isinstance(self.storage, LocalStorage):
            return 0
        top = self.storage.path_of(FOLDER)
        before = time.time() - self.ttl - 3600
        old = await asyncio.to_thread(_older_files, top, before)
        if not old:
            return 0
        pipe = self.rt.redis.pipeline(transaction=False)  # one round trip for them all
        for path in old:
            pipe.exists(self._blob_key(path.name))
        named = await pipe.execute()
        orphans = [p for p, n in zip(old, named, strict=True) if not n]
        removed = await asyncio.to_thread(_unlink_older, orphans, before)
        if removed:
            log.info("comfy v2 assets: %d uploaded files past their retention deleted", removed)
        return removed


async def _blake3(data: bytes) -> str:
    """The hex digest; a large file is hashed off the event loop (about 1 ms a MB)."""
    if len(data) <= 1 << 20:
        return blake3.blake3(data).hexdigest()
    return await asyncio.to_thread(lambda: blake3.blake3(data).hexdigest())


def _unlink_older(paths: list[Any], before: float) -> int:
    """Delete ``paths`` still older than ``before`` (one uploaded again meanwhile stays);
    how many went."""
    removed = 0
    for path in paths:
        try:
            if path.stat().st_mtime < before:
                path.unlink()
                removed += 1
        except OSError:
            continue
    return removed


def _older_files(top: Any, before: float) -> list[Any]:
    if not top.is_dir():
        return []
    old = []
    for path in top.iterdir():
        try:
            if path.is_file() and path.stat().st_mtime < before:
                old.append(path)
        except OSError:
            continue
    return old


def _named(ref: dict[str, Any]) -> str:
    """How a reference that names no asset is listed in ``missing_asset``."""
    info = ref.get("info")
    if not isinstance(info, dict):
        return "<core/ASSET without info>"
    return str(info.get("id") or info.get("hash") or "<no id>")


def _completed(record: dict[str, str]) -> dict[str, Any]:
    """The reference to an asset as a job's graph keeps it (its id, server-side hash, name)."""
    info = {"id": record["id"], "hash": f"blake3:{record['hex']}", "file_path": record["file_path"]}
    return {"__type": ASSET_TYPE, "info": info}


def _form(parts: list[Part]) -> tuple[Part, dict[str, str]]:
    """The ``file`` part (exactly one) and the text fields (the last of a name; ``tags``
    are read and not kept)."""
    files = [p for p in parts if p.name == "file"]
    if len(files) != 1:
        raise MalformedMultipart("exactly one 'file' part is required")
    fields = {p.name: p.text().strip() for p in parts if p.name not in ("file", "tags")}
    return files[0], fields
