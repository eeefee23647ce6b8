"""Who may talk to us: client tokens (JWT signed with TOKEN_SECRET, or static tokens),
the bridge token and the admin token. Every refusal names what to configure (issue 30
item 5): the texts are here, one per kind of caller.

A valid client token is a :class:`Principal`: the ids it names (a JWT's ``sub`` and its
``ids`` claim), which are the backendIds it may use and the only tasks it may read or
cancel, and the name its quota is kept under (issue 42 items 4 and 5)."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable
from dataclasses import dataclass
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


#: the JWT claim listing the ids a client token may use besides its ``sub``
IDS_CLAIM = "ids"
BAD_IDS = f"the JWT's {IDS_CLAIM!r} claim is not a list of strings: {EXPIRED_HINT}"


def _equal(a: str, b: str) -> bool:
    return bool(a) and bool(b) and hmac.compare_digest(a.encode(), b.encode())


@dataclass(frozen=True, slots=True)
class Principal:
    """Whom a valid client token speaks for. ``name``: whom its quota is charged to, however
    many ids it uses. ``ids``: the backendIds it names, whose tasks it may read and cancel
    (None: every task, for the admin and static tokens). ``unbound``: it may connect and
    submit as any id (``AIGCQ_BIND_CLIENT_IDS``, static and admin tokens)."""

    name: str
    ids: frozenset[str] | None
    unbound: bool = False

    @property
    def sub(self) -> str:
        """The one id it is named by (a JWT's ``sub``), else ``""``."""
        return self.name if self.ids and self.name in self.ids else ""

    def may_use(self, backend_id: str) -> bool:
        """Whether the token may connect as, or submit for, ``backend_id``."""
        return self.unbound or self.reads(backend_id)

    def reads(self, backend_id: str) -> bool:
        """Whether the token may read and cancel the tasks of ``backend_id``."""
        return self.ids is None or backend_id in self.ids

    def allowed(self) -> str:
        """The ids it may use, for a refusal's text."""
        if not self.ids:
            return "no id (it names none: no sub)"
        return "only " + ", ".join(repr(i) for i in sorted(self.ids))


def _named_ids(claims: dict[str, Any]) -> frozenset[str] | None:
    """A JWT's ``sub`` and ``ids``; None when ``ids`` is not a list of strings."""
    sub, more = claims.get("sub"), claims.get(IDS_CLAIM, [])
    if not isinstance(more, list) or not all(isinstance(i, str) and i for i in more):
        return None
    return frozenset([*more, *([sub] if isinstance(sub, str) and sub else [])])


class Auth:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def client(self, token: str | None) -> Principal | None:
        """Whom ``token`` speaks for when it is a valid client token, else ``None``."""
        if not token:
            return None
        if any(_equal(token, t) for t in self.settings.client_tokens):
            fingerprint = hashlib.sha256(token.encode()).hexdigest()[:12]
            return Principal(f"static:{fingerprint}", None, unbound=True)
        if self.admin(token):
            return Principal("admin", None, unbound=True)
        if not self.settings.token_secret:
            return None
        try:
            claims: dict[str, Any] = jwt.decode(  # a token without ``exp`` never expires
                token, self.settings.token_secret, algorithms=["HS256"], options=REQUIRE_EXP
            )
        except jwt.PyJWTError:
            return None
        ids = _named_ids(claims)
        if ids is None:
            return None
        binding = self.settings.bind_client_ids
        unbound = binding is IdBinding.OFF or (binding is IdBinding.SUB and not ids)
        sub = claims.get("sub")
        name = sub if isinstance(sub, str) and sub else ",".join(sorted(ids))
        return Principal(name, ids, unbound)

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
            if _named_ids(claims) is None:
                return f"{missing}: {BAD_IDS}"
            if isinstance(exp, int | float) and exp <= time.time():
                at = datetime.fromtimestamp(exp, UTC).isoformat(timespec="seconds")
                when = at.replace("+00:00", "Z")
                return f"token expired at {when}: {EXPIRED_HINT}"
        return f"{missing}: {CLIENT_TOKEN_HINT}"

    def id_refusal(self, principal: Principal, field: str, backend_id: str) -> str:
        """Why this token may not use ``backend_id``, and how to get one that may."""
        return (
            f"this token may not use {field} {backend_id!r}: it may use {principal.allowed()}; "
            f"a token names each id it uses (`aigcq token {principal.sub or 'ID'} --id "
            f"{backend_id}`); AIGCQ_BIND_CLIENT_IDS=off lets any valid token use any id "
            "(the original system)"
        )

    def bridge_refusal(self) -> str:
        """Why a bridge was refused, and what to configure."""
        if not self.settings.bridge_token and not self.settings.admin_token:
            return NO_BRIDGE_TOKEN
        return f"invalid or missing bridge token: {BRIDGE_TOKEN_HINT}"

    def admin(self, token: str | None) -> bool:
        return _equal(token or "", self.settings.admin_token)

    def bridge(self, token: str | None) -> bool:
        return _equal(token or "", self.settings.bridge_token) or self.admin(token)


def issue_client_token(
    secret: str, backend_id: str, ttl_s: int = 86400, ids: Iterable[str] = ()
) -> str:
    """A client JWT (HS256) as business backends would mint it with TOKEN_SECRET, for
    ``backend_id`` (its ``sub``) and, when given, the other ``ids`` it may use."""
    now = int(time.time())
    claims: dict[str, Any] = {"sub": backend_id, "iat": now, "exp": now + ttl_s}
    if more := sorted(set(ids) - {backend_id}):
        claims[IDS_CLAIM] = [backend_id, *more]
    return jwt.encode(claims, secret, "HS256")


def bearer(header: str | None) -> str | None:
    if header and header.lower().startswith("bearer "):
        return header[7:].strip()
    return None
