"""Volcengine's HMAC-SHA256 request signature (the ``Authorization`` header scheme of the
OpenAPI gateway, as implemented by ``volcengine.auth.SignerV4``), pure and small.

Used by the JimuAI adapter to sign and by the JimuAI emulator to verify. It signs what
the SDK signs: ``Content-Type``, ``Host`` and every ``X-*`` header (so ``X-Date`` and
``X-Content-Sha256``), the method, the path, the sorted query and the SHA-256 of the body;
the key is derived ``HMAC(HMAC(HMAC(HMAC(sk, date), region), service), "request")``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

ALGORITHM = "HMAC-SHA256"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"


def x_date(now: datetime | None = None) -> str:
    """``X-Date`` for ``now`` (default: the current time), e.g. ``20260101T120000Z``."""
    return (now or datetime.now(UTC)).astimezone(UTC).strftime(DATE_FORMAT)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _quote(text: str) -> str:
    return quote(text, safe="-_.~")


def canonical_query(query: Mapping[str, str]) -> str:
    """Sorted ``key=value`` pairs, RFC 3986-encoded (space as ``%20``)."""
    return "&".join(f"{_quote(k)}={_quote(query[k])}" for k in sorted(query))


def canonical_path(path: str) -> str:
    return quote(path or "/", safe="/~")


def signs(header: str) -> bool:
    """Whether the SDK signs ``header``: Content-Type, Content-Md5, Host and X-*."""
    name = header.lower()
    return name in ("content-type", "content-md5", "host") or name.startswith("x-")


def canonical_host(host: str) -> str:
    """The SDK drops a default port (80/443) from the signed ``Host``."""
    name, sep, port = host.rpartition(":")
    return name if sep and port in ("80", "443") else host


def canonical_request(
    method: str,
    path: str,
    query: Mapping[str, str],
    headers: Iterable[tuple[str, str]],
    body_sha256: str,
) -> tuple[str, str]:
    """``(canonical request, signed header names)`` for headers already chosen to sign."""
    signed = {name.lower(): value.strip() for name, value in headers}
    if "host" in signed:
        signed["host"] = canonical_host(signed["host"])
    names = sorted(signed)
    lines = "".join(f"{name}:{signed[name]}\n" for name in names)
    signed_names = ";".join(names)
    text = "\n".join(
        [method.upper(), canonical_path(path), canonical_query(query), lines, signed_names]
    )
    return f"{text}\n{body_sha256}", signed_names


def signing_key(secret_key: str, date: str, region: str, service: str) -> bytes:
    key = secret_key.encode()
    for part in (date, region, service, "request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def signature(
    secret_key: str, stamp: str, region: str, service: str, canonical: str
) -> tuple[str, str]:
    """``(signature hex, credential scope)`` of a canonical request signed at ``stamp``."""
    scope = f"{stamp[:8]}/{region}/{service}/request"
    to_sign = "\n".join([ALGORITHM, stamp, scope, sha256_hex(canonical.encode())])
    key = signing_key(secret_key, stamp[:8], region, service)
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest(), scope


@dataclass(frozen=True, slots=True)
class Credentials:
    access_key: str
    secret_key: str
    region: str = "cn-north-1"
    service: str = "cv"

    def __repr__(self) -> str:  # never print the secret key
        return f"Credentials(access_key={self.access_key!r}, region={self.region!r})"


def sign(
    creds: Credentials,
    *,
    method: str,
    host: str,
    path: str,
    query: Mapping[str, str],
    body: bytes,
    content_type: str = "application/json",
    stamp: str | None = None,
) -> dict[str, str]:
    """The headers of a signed request: ``Host``, ``Content-Type``, ``X-Date``,
    ``X-Content-Sha256`` and ``Authorization``."""
    stamp = stamp or x_date()
    body_hash = sha256_hex(body)
    headers = {
        "Host": host,
        "Content-Type": content_type,
        "X-Date": stamp,
        "X-Content-Sha256": body_hash,
    }
    canonical, signed_names = canonical_request(method, path, query, headers.items(), body_hash)
    sig, scope = signature(creds.secret_key, stamp, creds.region, creds.service, canonical)
    headers["Authorization"] = (
        f"{ALGORITHM} Credential={creds.access_key}/{scope}, "
        f"SignedHeaders={signed_names}, Signature={sig}"
    )
    return headers


@dataclass(frozen=True, slots=True)
class Authorization:
    """A parsed ``Authorization`` header."""

    access_key: str
    date: str
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str


def parse_authorization(value: str) -> Authorization | None:
    """Read ``HMAC-SHA256 Credential=AK/date/region/service/request, SignedHeaders=...,
    Signature=...``; None when it is not of that form."""
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        return None
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, val = part.strip().partition("=")
        if sep:
            fields[key] = val
    credential = fields.get("Credential", "").split("/")
    if len(credential) != 5 or credential[4] != "request" or not fields.get("Signature"):
        return None
    names = tuple(n for n in fields.get("SignedHeaders", "").split(";") if n)
    if not names:
        return None
    ak, date, region, service, _ = credential
    return Authorization(ak, date, region, service, names, fields["Signature"])
