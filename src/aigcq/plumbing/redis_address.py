"""Where a process's Redis is: one server (``redis://``, ``rediss://``, ``unix://``, redis-py's
URL forms) or a master found through Redis Sentinel.

The Sentinel form is one URL, so every process and worker passes it on like any other::

    redis+sentinel://[user:password@]host:port[,host:port...]/master[/db][?options]

``user:password`` are the master's (and its replicas') credentials; the query may carry
``sentinel_username`` and ``sentinel_password`` (the sentinels' own, when they require
auth) and redis-py's connection options (``socket_timeout=0.5`` ...), which apply to the
master's connections. A sentinel without a port is on 26379. ``AIGCQ_REDIS_SENTINELS`` and
``AIGCQ_REDIS_MASTER`` compose the same URL (:func:`sentinel_url`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

SCHEME = "redis+sentinel"
SENTINEL_PORT = 26379
_SENTINEL_AUTH = ("sentinel_username", "sentinel_password")


class RedisAddressError(ValueError):
    """A Redis URL or Sentinel setting that names no usable Redis: the message says what
    is wrong and what is expected."""


@dataclass(frozen=True, slots=True)
class SentinelAddress:
    """A master named ``master`` as the ``sentinels`` know it."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    #: the master's connection options: db, username, password, socket_timeout ...
    options: dict[str, Any] = field(default_factory=dict)
    #: the sentinels' own connection options (their auth, the socket timeouts)
    sentinel_options: dict[str, Any] = field(default_factory=dict)


def is_sentinel(url: str) -> bool:
    return url.lower().startswith(f"{SCHEME}://")


def parse_sentinel_url(url: str) -> SentinelAddress:
    """``url`` (``redis+sentinel://...``) read, or :class:`RedisAddressError`."""
    if not is_sentinel(url):
        raise RedisAddressError(f"not a {SCHEME}:// URL: {redacted(url)!r}")
    rest = url[len(SCHEME) + 3 :]
    netloc, _, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    userinfo, _, hosts = netloc.rpartition("@")
    sentinels = parse_sentinels(hosts)
    master, _, db = path.strip("/").partition("/")
    if not master:
        raise RedisAddressError(
            f"{redacted(url)!r}: no master name (expected {SCHEME}://host:port,.../master[/db])"
        )
    if db and not db.isdigit():
        raise RedisAddressError(f"{redacted(url)!r}: database {db!r} is not a number")
    params = dict(parse_qsl(query, keep_blank_values=True))
    sentinel_auth = {
        k.removeprefix("sentinel_"): params.pop(k) for k in _SENTINEL_AUTH if k in params
    }
    # the master's options are redis-py's own URL options, parsed by redis-py (imported
    # here: the settings, and so every CLI command, read this module)
    from redis.asyncio.connection import parse_url

    auth = f"{userinfo}@" if userinfo else ""
    options: dict[str, Any] = dict(parse_url(f"redis://{auth}x/{db or 0}?{urlencode(params)}"))
    for key in ("host", "port"):
        options.pop(key, None)
    timeouts = {k: v for k, v in options.items() if k.startswith("socket_")}
    return SentinelAddress(sentinels, master, options, {**timeouts, **sentinel_auth})


def parse_sentinels(text: str) -> tuple[tuple[str, int], ...]:
    """``host:port,host:port`` (``[v6]:port``; a port left out is 26379)."""
    found = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        split = urlsplit(f"//{item}")
        try:
            port = split.port or SENTINEL_PORT
        except ValueError as exc:
            raise RedisAddressError(f"sentinel {item!r}: bad port ({exc})") from exc
        if not split.hostname:
            raise RedisAddressError(f"sentinel {item!r}: no host (expected host:port)")
        found.append((unquote(split.hostname), port))
    if not found:
        raise RedisAddressError("no sentinels given (expected host:port,host:port,...)")
    return tuple(found)


def sentinel_url(
    sentinels: str,
    master: str,
    *,
    db: int = 0,
    username: str = "",
    password: str = "",
    sentinel_username: str = "",
    sentinel_password: str = "",
) -> str:
    """The ``redis+sentinel://`` URL of these settings (each checked)."""
    hosts = parse_sentinels(sentinels)
    if not master.strip() or "/" in master:
        raise RedisAddressError(f"master name {master!r}: expected the name the sentinels monitor")
    auth = ""
    if username or password:
        auth = f"{quote(username, safe='')}:{quote(password, safe='')}@"
    netloc = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in hosts)
    given = zip(_SENTINEL_AUTH, (sentinel_username, sentinel_password), strict=True)
    query = urlencode({k: v for k, v in given if v})
    return f"{SCHEME}://{auth}{netloc}/{quote(master.strip(), safe='')}/{db}" + (
        f"?{query}" if query else ""
    )


def redacted(url: str) -> str:
    """``url`` with every password replaced by ``***`` (for logs, errors and banners)."""
    head, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:***@{hosts}"
    path, q, query = tail.partition("?")
    if q:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = "&".join(f"{k}={'***' if 'password' in k else v}" for k, v in pairs)
    return f"{head}://{netloc}{slash}{path}{q}{query}"
