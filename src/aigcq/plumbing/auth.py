"""Who may talk to us: client tokens (JWT signed with TOKEN_SECRET, or static tokens),
the bridge token and the admin token. Every refusal names what to configure (issue 30
item 5): the texts are here, one per kind of caller."""

from __future__ import annotations

import hmac
import time
from datetime import UTC, datetime
from typing import Any

import jwt
from jwt.types import Options

from aigcq.config import IdBinding, Settings

#: PyJWT options: a token must say when it expires (one without ``exp`` is refused)
REQUIRE_EXP: Options = {"require": ["exp"]}
#: read an expired token's claims, to say when it expired
NO_EXP_CHECK: Options = {"verify_exp": False}


#: what a client presents (the WebSocket's ``?token=``, HTTP's ``Authorization: Bearer``)
CLIENT_TOKEN_HINT = (
    "a JWT signed with the server's TOKEN_SECRET (`aigcq token ID` prints one), "
    "or one of its AIGCQ_CLIENT_TOKENS"
)
EXPIRED_HINT = "mint a new one with the server's TOKEN_SECRET (`aigcq token ID`)"
NO_EXP = f"the JWT has no exp (a token that never expires is refused): {EXPIRED_HINT}"
NO_CLIENT_SECRET = (
    "this server accepts no client token: set TOKEN_SECRET (JWTs) or AIGCQ_CLIENT_TOKENS on it"
)
ADMIN_TOKEN_HINT = (
    "send the server's AIGCQ_ADMIN_TOKEN as Authorization: Bearer "
    "(`aigcq up` keeps a generated one in AIGCQ_DATA_DIR/secrets.json)"
)
BRIDGE_TOKEN_HINT = (
    "a bridge sends the server's AIGCQ_BRIDGE_TOKEN as ?token=, Authorization: Bearer or "
    "REGISTER data.token (`aigcq bridge --token-file`, or AIGCQ_BRIDGE_TOKEN on the bridge; "
    "`aigcq up` keeps a generated one in AIGCQ_DATA_DIR/secrets.json)"
)
NO_BRIDGE_TOKEN = (
    "this server has no AIGCQ_BRIDGE_TOKEN, so every bridge is refused: set it on the server "
    "and give each bridge the same value"
)


def _equal(a: str, b: str) -> bool:
    return bool(a) and bool(b) and hmac.compare_digest(a.encode(), b.encode())


class Auth:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def client(self, token: str | None) -> dict[str, Any] | None:
        """The token's claims when it is a valid client token, else ``None``."""
        if not token:
            return None
        if any(_equal(token, t) for t in self.settings.client_tokens):
            return {"static": True}
        if self.admin(token):
            return {"admin": True}
        if not self.settings.token_secret:
            return None
        try:
            claims: dict[str, Any] = jwt.decode(  # a token without ``exp`` never expires
                token, self.settings.token_secret, algorithms=["HS256"], options=REQUIRE_EXP
            )
        except jwt.PyJWTError:
            return None
        return claims

    def refusal(self, token: str | None, missing: str) -> str:
        """Why ``token`` is not a valid client token and what to send instead, for its
        error message (``missing``: what to say when it is not valid, e.g. where the token
        goes): an expired JWT says when it expired."""
        if not self.settings.token_secret and not self.settings.client_tokens:
            return f"{missing}: {NO_CLIENT_SECRET}"
        if token and self.settings.token_secret:
            try:
                claims = jwt.decode(
                    token, self.settings.token_secret, algorithms=["HS256"], options=NO_EXP_CHECK
                )
            except jwt.PyJWTError:
                return f"{missing}: {CLIENT_TOKEN_HINT}"
            exp = claims.get("exp")
            if exp is None:
                return f"{missing}: {NO_EXP}"
            if isinstance(exp, int | float) and exp <= time.time():
                at = datetime.fromtimestamp(exp, UTC).isoformat(timespec="seconds")
                when = at.replace("+00:00", "Z")
                return f"token expired at {when}: {EXPIRED_HINT}"
        return f"{missing}: {CLIENT_TOKEN_HINT}"

    def id_refusal(self, claims: dict[str, Any], field: str, backend_id: str) -> str:
        """Why a client with these claims may not use ``backend_id`` (see :meth:`may_use_id`)."""
        owner = token_owner(claims)
        allowed = f"only {owner!r} or {owner}-<anything>" if owner else "no id (it has no sub)"
        return (
            f"this token may not use {field} {backend_id!r}: it may use {allowed}; "
            "AIGCQ_BIND_CLIENT_IDS=off lets any valid token use any id (the original system)"
        )

    def bridge_refusal(self) -> str:
        """Why a bridge was refused, and what to configure."""
        if not self.settings.bridge_token and not self.settings.admin_token:
            return NO_BRIDGE_TOKEN
        return f"invalid or missing bridge token: {BRIDGE_TOKEN_HINT}"

    def may_use_id(self, claims: dict[str, Any], backend_id: str) -> bool:
        """Whether a client with these token claims may act as ``backend_id``. A JWT naming
        its client (``sub``) only for that ``sub`` or ``sub-<anything>`` (one backend,
        several connections); ``AIGCQ_BIND_CLIENT_IDS`` says what a JWT without ``sub`` may
        do (``sub``: any id, ``all``: none) or unbinds every token (``off``). Static and
        admin tokens stay unbound."""
        binding = self.settings.bind_client_ids
        owner = token_owner(claims)
        if binding is IdBinding.OFF or owner is None:
            return True
        if not owner:
            return binding is IdBinding.SUB
        return backend_id == owner or backend_id.startswith(f"{owner}-")

    def admin(self, token: str | None) -> bool:
        return _equal(token or "", self.settings.admin_token)

    def bridge(self, token: str | None) -> bool:
        return _equal(token or "", self.settings.bridge_token) or self.admin(token)


def token_owner(claims: dict[str, Any]) -> str | None:
    """The backendId a client token speaks for: a JWT's ``sub``, ``""`` (no backend) for a JWT
    without one, and ``None`` (every backend) for the admin token and static client tokens."""
    if claims.get("admin") or claims.get("static"):
        return None
    sub = claims.get("sub")
    return sub if isinstance(sub, str) else ""


def issue_client_token(secret: str, backend_id: str, ttl_s: int = 86400) -> str:
    """A client JWT (HS256) as business backends would mint it with TOKEN_SECRET."""
    now = int(time.time())
    return jwt.encode({"sub": backend_id, "iat": now, "exp": now + ttl_s}, secret, "HS256")


def bearer(header: str | None) -> str | None:
    if header and header.lower().startswith("bearer "):
        return header[7:].strip()
    return None
