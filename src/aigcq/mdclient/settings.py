"""Settings of ``aigcq serve`` as a message-dispatcher's client (seed 000 §3.7), by the
seed's names where it has them. It reads the same ``MD_USERNAME`` / ``MD_PASSWORD`` as
``aigcq dispatcher`` (:mod:`aigcq.dispatcher.settings`), so one ``.env`` serves both."""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

SETTINGS_CONFIG = SettingsConfigDict(
    env_file=".env", extra="ignore", populate_by_name=True, case_sensitive=False
)


def md_env(name: str, *seed_names: str) -> AliasChoices:
    return AliasChoices(f"AIGCQ_MD_{name}", *seed_names)


def _client_env(name: str) -> AliasChoices:
    return AliasChoices(f"AIGCQ_MESSAGE_DISPATCHER_{name}", f"MESSAGE_DISPATCHER_{name}")


class MdClientSettings(BaseSettings):
    """``aigcq serve`` using a message-dispatcher as its internal target."""

    model_config = SETTINGS_CONFIG

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
    username: str = Field("admin", validation_alias=md_env("USERNAME", "MD_USERNAME"))
    password: str = Field("", validation_alias=md_env("PASSWORD", "MD_PASSWORD"))
    jwt_refresh_interval_ms: int | None = Field(
        None,
        gt=0,
        validation_alias=md_env("JWT_REFRESH_INTERVAL_MS"),
        description="Also log in again this long after each login (seed jwt.refreshInterval).",
    )
    jwt_refresh_ahead_s: float = Field(
        4 * 3600.0,
        gt=0,
        validation_alias=md_env("JWT_REFRESH_AHEAD_S"),
        description="Log in again this long before the token expires (at most half its life).",
    )

    @property
    def active(self) -> bool:
        return self.enabled and bool(self.url)
