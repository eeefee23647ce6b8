"""Signed, expiring links to stored files: ``{base}/results/{expires}-{signature}/{name}``
(result custody's copies), and ``{base}/files/…`` the same way (a bridge's result files).

The signature is an HMAC over the file's name and the link's expiry (epoch seconds), keyed
by :func:`link_key` (derived from the webhook signing key, so no other secret is needed and
a webhook signature never passes as a link's; a bridge keys its own). A link whose
signature does not match is :data:`FORGED`; one past its expiry, :data:`EXPIRED` (checked
after the signature, so a forged link never learns whether its expiry would have passed).
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import quote

from aigcq.plumbing.signing import same_digest

#: the route that serves signed links, and the folder of the files they name
ROUTE = "/results"
FOLDER = "custody"
#: the folder of uploaded workflow inputs (Comfy API v2 assets): never served by ``/files``
INPUTS_FOLDER = "inputs"

FORGED, EXPIRED = "forged", "expired"


def link_key(signing_key: bytes) -> bytes:
    """The links' own key, derived from the webhook signing key."""
    if not signing_key:  # anyone could compute it: refuse to sign
        raise ValueError("empty signing key")
    return hmac.digest(signing_key, b"aigcq result links", hashlib.sha256)


def _signature(key: bytes, name: str, expires: int) -> str:
    return hmac.digest(key, f"{expires}/{name}".encode(), hashlib.sha256).hex()[:32]


def signed_url(base: str, key: bytes, name: str, expires: int, route: str = ROUTE) -> str:
    """The link to ``name`` under ``route`` that works until ``expires`` (epoch seconds);
    the name is signed as given and sent percent-encoded."""
    token = f"{expires}-{_signature(key, name, expires)}"
    return f"{base.rstrip('/')}{route}/{token}/{quote(name)}"


def refusal(key: bytes, token: str, name: str, now: float) -> str | None:
    """Why the link ``{token}/{name}`` is refused (:data:`FORGED`, :data:`EXPIRED`), or None."""
    expires, _, given = token.partition("-")
    if not (expires.isascii() and expires.isdigit() and len(expires) <= 12):
        return FORGED
    if not same_digest(_signature(key, name, int(expires)), given):
        return FORGED
    return EXPIRED if int(expires) < now else None
