"""Tenant and creator of a request, from ``Authorization`` / ``X-User-Info``.

``X-User-Info`` is read as JSON, plain or base64-encoded, with the tenant under ``tenantId``
(or ``tenant_id``, ``tenant``) and the creator under ``userId`` (or ``user_id``, ``username``,
``userName``, ``creator``). Both headers are kept verbatim to be forwarded to the OSS service.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_TENANT = "default"
ANONYMOUS = "anonymous"
_TENANT_KEYS = ("tenantId", "tenant_id", "tenant")
_CREATOR_KEYS = ("userId", "user_id", "username", "userName", "creator")


@dataclass(frozen=True)
class Identity:
    tenant_id: str
    creator: str
    authorization: str
    user_info: str

    def forward_headers(self) -> dict[str, str]:
        headers = {"Authorization": self.authorization, "X-User-Info": self.user_info}
        return {k: v for k, v in headers.items() if v}


def identity_from(headers: Mapping[str, str]) -> Identity:
    user_info = headers.get("x-user-info", "")
    info = _decode(user_info)
    return Identity(
        tenant_id=_first(info, _TENANT_KEYS) or DEFAULT_TENANT,
        creator=_first(info, _CREATOR_KEYS) or ANONYMOUS,
        authorization=headers.get("authorization", ""),
        user_info=user_info,
    )


def _decode(raw: str) -> dict[str, Any]:
    if not raw:
        return {}
    for text in (raw, _b64(raw)):
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, TypeError):
            continue
        if isinstance(value, dict):
            return value
    return {}


def _b64(raw: str) -> str:
    try:
        return base64.b64decode(raw + "=" * (-len(raw) % 4), validate=False).decode()
    except (binascii.Error, UnicodeDecodeError):
        return ""


def _first(info: Mapping[str, Any], keys: tuple[str, ...]) -> str:
    for key in keys:
        value = info.get(key)
        if value not in (None, ""):
            return str(value).replace("\x00", "")[:128]  # PostgreSQL text holds no NUL
    return ""
