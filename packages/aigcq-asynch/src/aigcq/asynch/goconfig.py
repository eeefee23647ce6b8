"""The Go service's ``config.yml``, read when present; environment variables still win.

Looked for at ``AIGCQ_ASYNCH_CONFIG``, else ``./config.yml``, ``./config/config.yml``,
``./manifest/config/config.yaml`` (GoFrame's default). Keys map to the environment variables
aigcq reads, which are set only where the environment does not set them already:

* ``asynch.<section>.<key>`` → ``AIGCQ_ASYNCH_<SECTION>_<KEY>`` (camelCase to snake case:
  ``asynch.worker.intervalSeconds`` → ``AIGCQ_ASYNCH_WORKER_INTERVAL_SECONDS``);
* ``server.address`` → ``AIGCQ_ASYNCH_HOST`` / ``_PORT``, with Go's meaning: ``":8091"`` (no
  host) listens on every interface (``0.0.0.0``), ``"[::]:8091"`` on every IPv6 one (``::``),
  ``"127.0.0.1:8091"`` on that address only;
* ``database.default`` — a GoFrame ``link`` (``pgsql:user:pass@tcp(host:port)/db``), or
  ``host`` / ``port`` / ``user`` / ``pass`` / ``name`` — → ``AIGCQ_DATABASE_URL``;
* ``redis.default`` — ``address`` / ``db`` / ``pass`` — → ``AIGCQ_REDIS_URL``.

Other keys are ignored.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml  # type: ignore[import-untyped,unused-ignore]  # PyYAML comes with uvicorn[standard]

log = logging.getLogger(__name__)

#: Where Go's ``net.Listen("tcp", ":port")`` listens: every interface.
ALL_INTERFACES = "0.0.0.0"
CANDIDATES = ("config.yml", "config/config.yml", "manifest/config/config.yaml")
_LINK = re.compile(
    r"^(?:pgsql|postgres|postgresql):(?P<user>[^:@]*)(?::(?P<password>.*))?"
    r"@(?:tcp\()?(?P<host>[^:/)]+)(?::(?P<port>\d+))?\)?/(?P<db>[^?]*)(?:\?(?P<query>.*))?$"
)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(f"{prefix}_{_snake(str(key))}", item, out)
    elif value is not None:
        out[prefix] = str(value).lower() if isinstance(value, bool) else str(value)


def _first(value: Any) -> Mapping[str, Any]:
    """GoFrame allows a node or a list of nodes (the first is the primary)."""
    if isinstance(value, list):
        value = value[0] if value else {}
    return value if isinstance(value, Mapping) else {}


def database_url(node: Mapping[str, Any]) -> str | None:
    link = str(node.get("link") or "")
    if link:
        match = _LINK.match(link)
        if match is None:
            raise ValueError(f"database.default.link is not a pgsql link: {link!r}")
        user, password = match["user"], match["password"]
        host, port, db, query = match["host"], match["port"], match["db"], match["query"]
    elif node.get("host"):
        user, password = str(node.get("user") or ""), node.get("pass")
        host, port, db, query = str(node["host"]), node.get("port"), node.get("name"), None
    else:
        return None
    auth = quote(str(user), safe="")
    if password:
        auth += ":" + quote(str(password), safe="")
    url = f"postgresql://{auth}@{host}" if auth else f"postgresql://{host}"
    url += f":{port}" if port else ""
    url += f"/{db or 'postgres'}"
    return url + (f"?{query}" if query else "")


def redis_url(node: Mapping[str, Any]) -> str | None:
    address = str(node.get("address") or "")
    if not address:
        return None
    password = node.get("pass") or node.get("password")
    auth = f":{quote(str(password), safe='')}@" if password else ""
    return f"redis://{auth}{address.split(',')[0]}/{int(node.get('db') or 0)}"


def listen_address(address: str) -> dict[str, str]:
    """``AIGCQ_ASYNCH_HOST`` / ``_PORT`` for a Go listen address (``host:port``, ``:port``)."""
    host, _, port = address.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    out = {"AIGCQ_ASYNCH_HOST": host or ALL_INTERFACES}
    if port:
        out["AIGCQ_ASYNCH_PORT"] = port
    return out


def environment(config: Mapping[str, Any]) -> dict[str, str]:
    """The environment variables ``config`` (a parsed config.yml) stands for."""
    out: dict[str, str] = {}
    asynch = config.get("asynch")
    if isinstance(asynch, Mapping):
        _flatten("AIGCQ_ASYNCH", asynch, out)
    server = config.get("server")
    address = str(server.get("address") or "") if isinstance(server, Mapping) else ""
    if address:
        out.update(listen_address(address))
    database = config.get("database")
    if isinstance(database, Mapping) and (url := database_url(_first(database.get("default")))):
        out["AIGCQ_DATABASE_URL"] = url
    redis = config.get("redis")
    if isinstance(redis, Mapping) and (url := redis_url(_first(redis.get("default")))):
        out["AIGCQ_REDIS_URL"] = url
    return out


def find(environ: Mapping[str, str]) -> Path | None:
    explicit = environ.get("AIGCQ_ASYNCH_CONFIG")
    if explicit:
        return Path(explicit)
    return next((Path(c) for c in CANDIDATES if Path(c).is_file()), None)


def apply(environ: MutableMapping[str, str] | None = None) -> Path | None:
    """Read the config file, if any, into ``environ`` (default ``os.environ``) where it has no
    value yet; the file read, or None."""
    env: MutableMapping[str, str] = os.environ if environ is None else environ
    path = find(env)
    if path is None:
        return None
    config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(config, Mapping):
        raise ValueError(f"{path}: not a YAML mapping")
    values = environment(config)
    for name, value in values.items():
        env.setdefault(name, value)
    log.info("read %s (%d settings; the environment wins)", path, len(values))
    return path
