"""Login and JWTs of the message-dispatcher (seed 000 §3.5): HS256, 24 h by default.

Tokens carry their own audience, so a client token signed with the same secret is refused.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass

import jwt

from aigcq.plumbing.auth import REQUIRE_EXP

AUDIENCE = "aigcq-message-dispatcher"

#: what a refused caller must configure (issue 30 item 5)
LOGIN_HINT = (
    "the dispatcher's MD_USERNAME (default admin) and MD_PASSWORD (unset: generated at its "
    "first start and printed once; kept as md_password in AIGCQ_DATA_DIR/secrets.json)"
)
TOKEN_HINT = (
    "log in with POST /api/auth/login {username, password} (MD_USERNAME / MD_PASSWORD) and "
    "send its access_token"
)


@dataclass(frozen=True, slots=True)
class IssuedToken:
    access_token: str
    expires_in: int
    expires_at: int  # epoch seconds

    def body(self) -> dict[str, object]:
        return {
            "access_token": self.access_token,
            "token_type": "Bearer",
            "expires_in": self.expires_in,
            "expires_at": self.expires_at,
        }


class DispatcherAuth:
    def __init__(self, username: str, password: str, secret: str, ttl_s: int) -> None:
        self.username = username
        self.password = password
        self.secret = secret
        self.ttl_s = ttl_s

    def login(self, username: str, password: str) -> IssuedToken | None:
        """A fresh token for the right credentials, else ``None``."""
        ok = hmac.compare_digest(username.encode(), self.username.encode())
        ok &= hmac.compare_digest(password.encode(), self.password.encode())
        if not ok:
            return None
        now = int(time.time())
        claims = {"sub": username, "aud": AUDIENCE, "iat": now, "exp": now + self.ttl_s}
        return IssuedToken(jwt.encode(claims, self.secret, "HS256"), self.ttl_s, now + self.ttl_s)

    def valid(self, token: object) -> bool:
        """Whether ``token`` is an unexpired token issued by :meth:`login`."""
        if not isinstance(token, str) or not token:
            return False
        try:
            jwt.decode(
                token, self.secret, algorithms=["HS256"], audience=AUDIENCE, options=REQUIRE_EXP
            )
        except jwt.PyJWTError:
            return False
        return True
