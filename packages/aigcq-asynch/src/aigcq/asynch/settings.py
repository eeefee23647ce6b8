"""Settings of the asynch service (``AIGCQ_ASYNCH_*``).

The connection URLs and the data directory come from :class:`aigcq.config.Settings`
(``AIGCQ_DATABASE_URL``, ``AIGCQ_REDIS_URL``, ``AIGCQ_DATA_DIR``). The seed's ``config.yml``
keys map as ``asynch.worker.intervalSeconds`` → ``AIGCQ_ASYNCH_WORKER_INTERVAL_SECONDS`` etc.
"""

from __future__ import annotations

import socket

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Listen addresses that mean every interface: not an address a client can use.
WILDCARDS = ("0.0.0.0", "::", "")


class AsynchSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AIGCQ_ASYNCH_", env_file=".env", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8091
    public_url: str = Field(
        "",
        description="Base URL of this service (its file URLs); default http://host:port, this"
        " machine's name for a host of 0.0.0.0 or ::.",
    )

    worker_enabled: bool = Field(False, description="Run the worker loop in this process.")
    worker_interval_seconds: float = Field(5.0, gt=0, description="Loop and directed-poll pause.")
    worker_batch_size: int = Field(10, ge=1, description="Tasks claimed per pass.")
    worker_goroutines: int = Field(
        1, ge=1, description="Claim loops; in-flight cap is goroutines × batch_size."
    )
    cleaner_enabled: bool = Field(False, description="Run the cleaner loop in this process.")
    cleaner_interval_seconds: float = Field(30.0, gt=0)

    prompts_core_url: str = Field("", description="Base URL of prompts-core (model type sync).")
    max_payload_bytes: int = Field(1 << 20, ge=1, description="Largest createTask body.")
    result_text_max_chars: int = Field(65536, ge=0, description="Result text kept in the row.")
    lease_seconds: float = Field(
        30.0, gt=0, description="Semaphore lease; renewed by the worker every third of it."
    )
    running_grace_seconds: float = Field(
        30.0, ge=0, description="State 1 fails after timeout_seconds plus this."
    )
    queue_timeout_seconds: float = Field(86400.0, gt=0, description="State 0 fails after this.")
    gate_grace_seconds: float = Field(
        60.0, ge=0, description="Gate entries younger than this are not reconciled away."
    )
    model_cache_seconds: float = Field(2.0, ge=0, description="Model config cache per process.")
    upload_attempts: int = Field(3, ge=1)
    callback_attempts: int = Field(5, ge=1)
    callback_backoff_seconds: float = Field(1.0, ge=0, description="First retry pause, doubled.")
    callback_poll_seconds: float = Field(
        1.0, gt=0, description="How often the sender looks for callbacks owed (besides wake-ups)."
    )
    reply_max_bytes: int = Field(
        16 << 20, ge=1, description="Largest model reply accepted; a larger one fails the call."
    )
    db_acquire_timeout_seconds: float = Field(
        5.0, gt=0, description="Longest wait for a PostgreSQL connection before answering 503."
    )
    admin_token: str = Field(
        "",
        description="Bearer token the management routes require (unset: `aigcq asynch` "
        "generates one, kept as asynch_admin_token in AIGCQ_DATA_DIR/secrets.json).",
    )
    admin_open: bool = Field(
        False,
        description="true: the management routes need no token (the Go service's behaviour).",
    )
    model_hosts: str = Field(
        "",
        description="Comma-separated hosts a model's baseUrl may name (exact, *.suffix or a"
        " CIDR); unset: any host but link-local addresses.",
    )
    runtime_ttl_seconds: int = Field(7200, ge=1, description="TTL of autoTune's runtime limits.")
    db_pool_max: int = Field(20, ge=1)

    @property
    def base_url(self) -> str:
        """``public_url``, or ``http://host:port`` when unset (this machine's name for a host
        that means every interface, ``0.0.0.0`` or ``::``); no trailing slash."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = socket.gethostname() if self.host in WILDCARDS else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"
