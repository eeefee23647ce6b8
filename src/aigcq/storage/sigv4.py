"""AWS Signature Version 4 for single S3 requests (no chunked uploads, no presigning)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from datetime import datetime
from urllib.parse import quote

ALGORITHM = "AWS4-HMAC-SHA256"


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signing_key(secret_key: str, date: str, region: str, service: str) -> bytes:
    k_date = _hmac(f"AWS4{secret_key}".encode(), date)
    return _hmac(_hmac(_hmac(k_date, region), service), "aws4_request")


def authorization(
    *,
    method: str,
    path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    payload_hash: str,
    access_key: str,
    secret_key: str,
    region: str,
    when: datetime,
    service: str = "s3",
) -> str:
    """The ``Authorization`` header value for a request whose ``headers`` (which must include
    ``host``, ``x-amz-date`` and ``x-amz-content-sha256``) are all signed."""
    amz_date = when.strftime("%Y%m%dT%H%M%SZ")
    date = amz_date[:8]
    lowered = {k.lower().strip(): " ".join(v.split()) for k, v in headers.items()}
    signed = ";".join(sorted(lowered))
    canonical = "\n".join(
        [
            method,
            quote(path, safe="/~"),
            "&".join(
                f"{quote(k, safe='~')}={quote(v, safe='~')}" for k, v in sorted(query.items())
            ),
            "".join(f"{k}:{lowered[k]}\n" for k in sorted(lowered)),
            signed,
            payload_hash,
        ]
    )
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        [ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = signing_key(secret_key, date, region, service)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    credential = f"Credential={access_key}/{scope}"
    return f"{ALGORITHM} {credential}, SignedHeaders={signed}, Signature={signature}"
