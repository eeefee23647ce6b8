"""Settings of the split topology (seed 000 §3.7), by the seed's names where it has them.

:class:`DispatcherSettings` configures ``aigcq dispatcher`` (the message-dispatcher);
:class:`aigcq.mdclient.settings.MdClientSettings` configures ``aigcq serve`` as its
client. Both read the same ``MD_USERNAME`` / ``MD_PASSWORD``, so one ``.env`` serves both.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from aigcq.mdclient.settings import SETTINGS_CONFIG as _CONFIG
from aigcq.mdclient.settings import md_env as _env


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
