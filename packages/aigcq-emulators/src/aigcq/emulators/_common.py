"""What the platform emulators share: config basics, ids, failure dice, result files."""

from __future__ import annotations

import random
import time
import zlib
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from aigcq.emulators._faults import Faults
from aigcq.emulators._http import read_json, reply
from aigcq.emulators._records import Records
from aigcq.emulators.png import tiny_png


@dataclass
class EmulatorConfig:
    """Settings every emulator has.

    ``duration_s`` is how long a task runs (0 = it ends at once), ``failure_rate`` the share
    of tasks that fail (drawn from a ``seed``-ed RNG when given), ``public_url`` the base URL
    put in result file links (default: the base URL of the first request received),
    ``retention_s`` how long a finished task is kept (then it is unknown, which bounds memory),
    ``file_ttl_s`` how long a result file's link works once handed out (then it answers as
    an expired link does, see :class:`FileLinks`; the vendors' links last about a day).
    """

    duration_s: float = 1.0
    failure_rate: float = 0.0
    seed: int | None = None
    public_url: str | None = None
    retention_s: float = 3600.0
    file_ttl_s: float = 86400.0

    def __post_init__(self) -> None:
        if self.duration_s < 0:
            raise ValueError("duration_s must be >= 0")
        if not 0.0 <= self.failure_rate <= 1.0:
            raise ValueError("failure_rate must be within 0..1")
        if self.file_ttl_s <= 0:
            raise ValueError("file_ttl_s must be > 0")


class SnowflakeIds:
    """Strictly increasing 19-digit decimal ids (milliseconds << 22, plus a sequence)."""

    def __init__(self) -> None:
        self._last = 0

    def __call__(self) -> str:
        self._last = max(self._last + 1, int(time.time() * 1000) << 22)
        return str(self._last)


class Retention:
    """Keys queued by the time they end (added in time order); old ones are handed back."""

    def __init__(self, keep_s: float) -> None:
        self._keep_s = keep_s
        self._ends: deque[tuple[float, str]] = deque()

    def add(self, ended_at: float, key: str) -> None:
        self._ends.append((ended_at, key))

    def expired(self, now: float) -> Iterator[str]:
        """Pop and yield the keys that ended more than ``keep_s`` before ``now``."""
        horizon = now - self._keep_s
        while self._ends and self._ends[0][0] < horizon:
            yield self._ends.popleft()[1]


class FileLinks:
    """When each result file's link was first handed out, and which links have expired:
    those older than ``ttl_s``, and those expired on demand (:meth:`expire`). A file whose
    link was never handed out (or was forgotten, past :data:`LINKS_KEPT`) is not expired."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._born: dict[str, float] = {}  # item id -> wall-clock time, oldest first
        self._expired: set[str] = set()
        self._all_before = 0.0  # links handed out up to this time are expired

    def born(self, item_id: str) -> float:
        """When ``item_id``'s link was first handed out (now, if this is the first time)."""
        found = self._born.get(item_id)
        if found is None:
            found = self._born[item_id] = time.time()
            if len(self._born) > LINKS_KEPT:
                del self._born[next(iter(self._born))]
        return found

    def expired(self, item_id: str) -> bool:
        born = self._born.get(item_id)
        if item_id in self._expired:
            return True
        return born is not None and (born <= self._all_before or time.time() - born > self.ttl_s)

    def expire(self, which: Any) -> dict[str, Any]:
        """``"all"``: every link handed out so far; a list: those items' links. The answer
        of ``POST /_emulator/files``."""
        if which == "all":
            self._all_before = time.time()
        elif isinstance(which, list):
            self._expired.update(str(item) for item in which)
        return {"ttl_s": self.ttl_s, "expired": sorted(self._expired)}


#: links whose birth a :class:`FileLinks` remembers (the oldest are forgotten first)
LINKS_KEPT = 100_000


def result_colour(item_id: str) -> tuple[int, int, int]:
    """The one colour of a result's image, derived from its id."""
    digest = zlib.crc32(item_id.encode())
    return digest & 0xFF, (digest >> 8) & 0xFF, (digest >> 16) & 0xFF


def result_png(item_id: str) -> bytes:
    """The PNG of a result, ``GET /files/{item_id}/...``."""
    return tiny_png(result_colour(item_id))


class EmulatorCore(ABC):
    """State common to emulators: config, ids, failure dice, the public base URL."""

    #: the name of a result's file in its URL
    file_name = "output.png"
    #: links carry their expiry (``?x-expires=<epoch s>&x-signature=…``, as the signed CDN
    #: links of ByteDance's image service do) and answer 403 once expired; else plain
    #: links that answer 404 once expired (a CDN whose file was deleted)
    signed_links: ClassVar[bool] = False

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.new_id = SnowflakeIds()
        self._rng = random.Random(config.seed)
        self._public_url = config.public_url.rstrip("/") if config.public_url else None
        self.retention = Retention(config.retention_s)
        self.faults = Faults()
        self.records = Records()
        self.links = FileLinks(config.file_ttl_s)
        #: what happened how often, for :meth:`stats`
        self.counts: Counter[str] = Counter()

    def draw_failure(self) -> bool:
        rate = self.config.failure_rate
        return rate > 0 and self._rng.random() < rate

    def remember_base(self, request: Request) -> None:
        """Use the first request's base URL for file links unless ``public_url`` is set."""
        if self._public_url is None:
            self._public_url = str(request.base_url).rstrip("/")

    def file_url(self, item_id: str, name: str = "") -> str:
        url = f"{self._public_url}/files/{item_id}/{name or self.file_name}"
        born = self.links.born(item_id)
        if not self.signed_links:
            return url
        expires = int(born + self.links.ttl_s)
        signature = f"{zlib.crc32(f'{item_id}:{expires}'.encode()):08x}"
        return f"{url}?x-expires={expires}&x-signature={signature}"

    def file_body(self, item_id: str) -> tuple[bytes, str]:
        """A result file's bytes and media type (a PNG unless the platform's are others)."""
        return result_png(item_id), "image/png"

    @abstractmethod
    def has_file(self, item_id: str) -> bool:
        """Whether ``item_id`` produced an output file (the file route answers 404 if not)."""

    @abstractmethod
    def stats(self) -> dict[str, Any]: ...

    def records_json(self) -> dict[str, Any]:
        """What ``GET /_emulator/records`` answers."""
        return self.records.as_json()


def add_common_routes(app: FastAPI, core: EmulatorCore) -> None:
    """``GET /files/{id}/{name}`` (a small image per result; 404 or 403 once its link
    expired, see :class:`FileLinks`), ``POST /_emulator/files`` (``{"expire": "all" | [ids]}``),
    ``GET /_emulator/stats``, ``GET /_emulator/records`` (:mod:`aigcq.emulators._records`)
    and ``POST /_emulator/faults`` (:mod:`aigcq.emulators._faults`)."""

    async def file(request: Request) -> Response:
        item_id = request.path_params["item_id"]
        if not core.has_file(item_id):
            return reply({"detail": "not found"}, 404)
        if core.links.expired(item_id):
            core.counts["expired_file_reads"] += 1
            if core.signed_links:
                return reply({"Code": "AccessDenied", "Message": "Request has expired"}, 403)
            return reply({"detail": "not found"}, 404)
        body, media_type = core.file_body(item_id)
        return Response(body, media_type=media_type)

    async def files(request: Request) -> Response:
        body = await read_json(request)
        return reply(core.links.expire(body.get("expire") if isinstance(body, dict) else None))

    async def stats(request: Request) -> Response:
        return reply(core.stats())

    async def records(request: Request) -> Response:
        return reply(core.records_json())

    async def faults(request: Request) -> Response:
        return reply(core.faults.update(await read_json(request)))

    app.add_route("/files/{item_id}/{name}", file, methods=["GET"])
    app.add_route("/_emulator/files", files, methods=["POST"])
    app.add_route("/_emulator/stats", stats, methods=["GET"])
    app.add_route("/_emulator/records", records, methods=["GET"])
    app.add_route("/_emulator/faults", faults, methods=["POST"])
