"""Settings of the split topology (seed 000 §3.7), by the seed's names where it has them.

:class:`DispatcherSettings` configures ``aigcq dispatcher`` (the message-dispatcher);
:class:`MdClientSettings` configures ``aigcq serve`` as its client. Both read the same
``MD_USERNAME`` / ``MD_PASSWORD``, so one ``.env`` serves both processes.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

_CONFIG = SettingsConfigDict(
    env_file=".env", extra="ignore", populate_by_name=True, case_sensitive=False
)


def _env(name: str, *seed_names: str) -> AliasChoices:
    return AliasChoices(f"AIGCQ_MD_{name}", *seed_names)


def _client_env(name: str) -> AliasChoices:
    return AliasChoices(f"AIGCQ_MESSAGE_DISPATCHER_{name}", f"MESSAGE_DISPATCHER_{name}")


class DispatcherSettings(BaseSettings):
    """``aigcq dispatcher``: its port, Redis key prefix, login and JWT lifetime."""

    model_config = _CONFIG

    port: int = Field(4000, validation_alias=_env("PORT"))
    prefix: str = Field("md", min_length=1, validation_alias=_env("PREFIX"))
    public_url: str = Field(
        "",
        validation_alias=_env("PUBLIC_URL"),
        description="Base URL bridges post TASK_END to; default http://<host>:<port>.",
    )
    username: str = Field("admin", min_length=1, validation_alias=_env("USERNAME", "MD_USERNAME"))
    password: str = Field(
        "", validation_alias=_env("PASSWORD", "MD_PASSWORD"), description="Unset: generated."
    )
    jwt_secret: str = Field(
        "", validation_alias=_env("JWT_SECRET"), description="Unset: generated."
    )
    jwt_ttl_s: int = Field(86400, gt=0, validation_alias=_env("JWT_TTL_S"))
    webhook_attempts: int = Field(8, ge=1, validation_alias=_env("WEBHOOK_ATTEMPTS"))
    failure_retries: int = Field(
        3,
        ge=0,
        validation_alias=_env("FAILURE_RETRIES"),
        description="Times a task whose bridge reports a failure is run again.",
    )
    stale_after_s: float = Field(
        1800.0,
        gt=0,
        validation_alias=_env("STALE_AFTER_S"),
        description="A task pending this long fails, with a failure webhook.",
    )
    cache_interval_s: float = Field(
        5.0, gt=0, validation_alias=_env("CACHE_INTERVAL_S"), description="Expiry/mirror pass."
    )


class MdClientSettings(BaseSettings):
    """``aigcq serve`` using a message-dispatcher as its internal target."""

    model_config = _CONFIG

    url: str = Field("", validation_alias=_client_env("URL"))
    enabled: bool = Field(True, validation_alias=_client_env("ENABLED"))
    timeout_ms: int = Field(30000, gt=0, validation_alias=_client_env("TIMEOUT"))
    health_check_interval_ms: int = Field(
        10000, gt=0, validation_alias=_client_env("HEALTH_CHECK_INTERVAL")
    )
    health_check_timeout_ms: int = Field(
        5000, gt=0, validation_alias=_client_env("HEALTH_CHECK_TIMEOUT")
    )
    health_check_failure_threshold: int = Field(
        1,
        ge=1,
        validation_alias=_client_env("HEALTH_CHECK_FAILURE_THRESHOLD"),
        description="Failed health checks in a row that degrade (a failed submit: at once).",
    )
    priority: bool = Field(
        True,
        validation_alias=_client_env("PRIORITY"),
        description="true: the dispatcher first; false: RunningHub first, the dispatcher "
        "takes what RunningHub has no room for.",
    )
    retry_count: int = Field(
        0,
        ge=0,
        validation_alias=_client_env("RETRY_COUNT"),
        description="Times a submit the dispatcher failed (error, not timeout) is sent again "
        "before the task goes back to be routed (to RunningHub while degraded).",
    )
    username: str = Field("admin", validation_alias=_env("USERNAME", "MD_USERNAME"))
    password: str = Field("", validation_alias=_env("PASSWORD", "MD_PASSWORD"))
    jwt_refresh_interval_ms: int | None = Field(
        None,
        gt=0,
        validation_alias=_env("JWT_REFRESH_INTERVAL_MS"),
        description="Also log in again this long after each login (seed jwt.refreshInterval).",
    )
    jwt_refresh_ahead_s: float = Field(
        4 * 3600.0,
        gt=0,
        validation_alias=_env("JWT_REFRESH_AHEAD_S"),
        description="Log in again this long before the token expires (at most half its life).",
    )

    @property
    def active(self) -> bool:
        return self.enabled and bool(self.url)
