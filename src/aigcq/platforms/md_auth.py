"""The message-dispatcher JWT (seed 000 §3.5): log in at start-up, log in again ahead of
expiry or at once when the dispatcher refuses the token (:meth:`JwtManager.renew_now`),
retry failures with exponential back-off.

Dispatch never waits for it: :meth:`JwtManager.current` answers at once, ``None`` while
there is no valid token (the internal target then offers no capacity and tasks overflow).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

log = logging.getLogger(__name__)


class LoginFailed(Exception):
    """The dispatcher refused the login or answered without a token."""


class JwtManager:
    def __init__(
        self,
        base_url: str,
        username: str,
        password: str,
        *,
        refresh_ahead_s: float = 4 * 3600.0,
        refresh_every_s: float | None = None,
        timeout_s: float = 10.0,
        max_backoff_s: float = 32.0,
    ) -> None:
        self.login_url = base_url.rstrip("/") + "/api/auth/login"
        self.username = username
        self.password = password
        self.refresh_ahead_s = refresh_ahead_s
        self.refresh_every_s = refresh_every_s
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self.token: str | None = None
        self.expires_at = 0.0  # local epoch seconds
        self.lifetime_s = 0.0
        self._renew = asyncio.Event()

    def current(self) -> str | None:
        """The token while it is valid, else ``None``."""
        return self.token if self.token and time.time() < self.expires_at else None

    def renew_now(self) -> None:
        """Drop the token (the dispatcher refused it) and log in again at once."""
        if self.token is not None:
            log.warning("message-dispatcher refused our token: logging in again")
        self.token = None
        self._renew.set()

    def refresh_in(self) -> float:
        """Seconds until the next login: ``refresh_ahead_s`` early, at most half the life,
        and at most ``refresh_every_s`` after the last login."""
        due = self.expires_at - min(self.refresh_ahead_s, self.lifetime_s / 2)
        if self.refresh_every_s is not None:
            due = min(due, self.expires_at - self.lifetime_s + self.refresh_every_s)
        return max(due - time.time(), 0.1)

    async def login(self, http: httpx.AsyncClient) -> None:
        resp = await http.post(
            self.login_url, json={"username": self.username, "password": self.password}
        )
        try:
            body = resp.json()
        except ValueError as exc:
            raise LoginFailed(f"HTTP {resp.status_code}: not JSON") from exc
        data = body.get("data") if isinstance(body, dict) and body.get("success") else None
        token = data.get("access_token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not token:
            raise LoginFailed(f"HTTP {resp.status_code}: {str(body)[:200]}")
        assert isinstance(data, dict)
        self.lifetime_s = float(data.get("expires_in") or 86400)
        self.token, self.expires_at = token, time.time() + self.lifetime_s
        log.info("message-dispatcher token renewed (valid %.0f s)", self.lifetime_s)

    async def run(self) -> None:
        """Keep a valid token until cancelled."""
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            while True:
                self._renew.clear()
                await self._login_with_retries(http)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._renew.wait(), self.refresh_in())

    async def _login_with_retries(self, http: httpx.AsyncClient) -> None:
        retrying = AsyncRetrying(
            retry=retry_if_exception_type((httpx.HTTPError, LoginFailed)),
            wait=wait_exponential(multiplier=1, max=self.max_backoff_s),
            before_sleep=lambda state: log.warning(
                "message-dispatcher login failed (attempt %d): %r",
                state.attempt_number,
                state.outcome.exception() if state.outcome else None,
            ),
        )
        async for attempt in retrying:
            with attempt:
                await self.login(http)
