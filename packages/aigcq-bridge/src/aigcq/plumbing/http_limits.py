"""The bounds of a process's listening surfaces, as settings (``AIGCQ_*``), and the answer
that names them: what the server's uvicorn (:mod:`aigcq.plumbing.connection_limits`) and the
bridge's own HTTP server (:mod:`aigcq.agent.http_server`) apply. Apart from both, so that
reading the settings (every command's :class:`~aigcq.config.Settings`) loads neither.
"""

from __future__ import annotations

import resource
from http import HTTPStatus

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

#: paths answered even beyond the connection limit (liveness and readiness probes)
PROBES = frozenset({"/healthz", "/readyz", "/health", "/api/health"})
#: connections beyond the limit still read, so a probe among them is answered
PROBE_RESERVE = 32
#: file descriptors kept for everything but listening sockets (Redis, PostgreSQL, files…)
FD_RESERVE = 256


def _env(name: str) -> AliasChoices:
    return AliasChoices(f"AIGCQ_{name}")


class HttpLimits(BaseSettings):
    """The bounds of a server process's listening surfaces (``AIGCQ_*``)."""

    model_config = SettingsConfigDict(
        env_file=".env", extra="ignore", populate_by_name=True, case_sensitive=False
    )

    http_header_timeout_s: float = Field(
        10.0,
        gt=0,
        validation_alias=_env("HTTP_HEADER_TIMEOUT_S"),
        description="A connection's request line and headers must arrive within this "
        "(from the connection, or the next request's first byte); else it is closed.",
    )
    http_keepalive_s: int = Field(
        5,
        ge=1,
        validation_alias=_env("HTTP_KEEPALIVE_S"),
        description="An idle keep-alive HTTP connection is closed after this.",
    )
    http_max_header_bytes: int = Field(
        32768,
        ge=1024,
        validation_alias=_env("HTTP_MAX_HEADER_BYTES"),
        description="Largest request line plus headers; a larger one gets 431.",
    )
    max_connections: int = Field(
        4096,
        ge=1,
        validation_alias=_env("MAX_CONNECTIONS"),
        description="Open HTTP and WebSocket connections per process (at most the open-file "
        "limit minus 256); a request beyond it gets 503, health probes excepted.",
    )
    ws_ping_interval_s: float = Field(
        20.0,
        gt=0,
        validation_alias=_env("WS_PING_INTERVAL_S"),
        description="WebSocket protocol pings to every peer at this interval.",
    )
    ws_ping_timeout_s: float = Field(
        20.0,
        gt=0,
        validation_alias=_env("WS_PING_TIMEOUT_S"),
        description="A WebSocket peer that does not answer a ping within this is closed.",
    )

    def connection_limit(self) -> int:
        """``max_connections``, lowered to what the open-file limit allows."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return min(self.max_connections, max(16, soft - FD_RESERVE - PROBE_RESERVE))

    def refusal(self, status: int, why: str) -> bytes:
        """A whole ``Connection: close`` answer of ``status`` (408, 431 or 503, with
        ``Retry-After``) whose text names ``why`` and the setting to change."""
        setting = {
            408: f"AIGCQ_HTTP_HEADER_TIMEOUT_S={self.http_header_timeout_s:g}",
            431: f"AIGCQ_HTTP_MAX_HEADER_BYTES={self.http_max_header_bytes}",
            503: f"AIGCQ_MAX_CONNECTIONS={self.connection_limit()} per process",
        }[status]
        body = f"{why} ({setting})\n".encode()
        head = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            "content-type: text/plain; charset=utf-8",
            f"content-length: {len(body)}",
            "connection: close",
        ]
        if status == 503:
            head.append("retry-after: 1")
        return "\r\n".join(head).encode() + b"\r\n\r\n" + body
