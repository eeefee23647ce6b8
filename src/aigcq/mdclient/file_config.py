"""``config/messageDispatcher.json`` (seed 000 §3.7), read by ``aigcq serve`` like model.json.

Every field is optional; a malformed file stops start-up with a :class:`ConfigError` naming
the file and the field. An environment variable that is set wins over the file. Mapping:

=============================  ===============================================
``enabled``                    ``MESSAGE_DISPATCHER_ENABLED``
``healthCheck.interval`` (ms)  ``MESSAGE_DISPATCHER_HEALTH_CHECK_INTERVAL``
``healthCheck.timeout`` (ms)   ``MESSAGE_DISPATCHER_HEALTH_CHECK_TIMEOUT``
``task.timeout`` (ms)          ``MESSAGE_DISPATCHER_TIMEOUT``
``capacity.internal``          ``INTERNAL_CAPACITY_MAX``
``capacity.external``          ``EXTERNAL_CAPACITY_MAX``
``jwt.refreshInterval`` (ms)   ``AIGCQ_MD_JWT_REFRESH_INTERVAL_MS``
``priority``                   ``MESSAGE_DISPATCHER_PRIORITY``
``healthCheck.failureThreshold``  ``MESSAGE_DISPATCHER_HEALTH_CHECK_FAILURE_THRESHOLD``
``task.retryCount``            ``MESSAGE_DISPATCHER_RETRY_COUNT``
=============================  ===============================================

``priority`` false puts RunningHub first and the dispatcher second (it takes what
RunningHub has no room for); ``failureThreshold`` counts failed health checks in a row
(a failed or timed-out submit still degrades at once, seed §3.4); ``retryCount`` resends a
submit the dispatcher failed before the task is routed again.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from aigcq.config import Settings, _read_json, _validate
from aigcq.mdclient.settings import MdClientSettings

FILE_NAME = "messageDispatcher.json"


class _Section(BaseModel):
    """Fields keep the seed's camelCase names."""

    model_config = ConfigDict(extra="forbid")


class HealthCheck(_Section):
    interval: int | None = Field(None, gt=0)
    timeout: int | None = Field(None, gt=0)
    failureThreshold: int | None = Field(None, ge=1)


class TaskSection(_Section):
    timeout: int | None = Field(None, gt=0)
    retryCount: int | None = Field(None, ge=0)


class Capacity(_Section):
    internal: int | None = Field(None, ge=0)
    external: int | None = Field(None, ge=0)


class Jwt(_Section):
    refreshInterval: int | None = Field(None, gt=0)


class MdFile(_Section):
    enabled: bool | None = None
    priority: bool | None = None
    healthCheck: HealthCheck = Field(default_factory=HealthCheck)
    task: TaskSection = Field(default_factory=TaskSection)
    capacity: Capacity = Field(default_factory=Capacity)
    jwt: Jwt = Field(default_factory=Jwt)


def load_md_file(config_dir: Path) -> MdFile | None:
    """The file's content, ``None`` when there is no file."""
    path = config_dir / FILE_NAME
    raw = _read_json(path, None)
    return None if raw is None else _validate(MdFile, raw, path, "")


def apply_md_file(file: MdFile, md: MdClientSettings, settings: Settings) -> None:
    """Copy the file's values into settings not set by the environment."""
    _fill(
        md,
        enabled=file.enabled,
        health_check_interval_ms=file.healthCheck.interval,
        health_check_timeout_ms=file.healthCheck.timeout,
        timeout_ms=file.task.timeout,
        jwt_refresh_interval_ms=file.jwt.refreshInterval,
        priority=file.priority,
        health_check_failure_threshold=file.healthCheck.failureThreshold,
        retry_count=file.task.retryCount,
    )
    _fill(
        settings,
        internal_capacity_max=file.capacity.internal,
        external_capacity_max=file.capacity.external,
    )


def _fill(target: BaseModel, **values: object) -> None:
    for name, value in values.items():
        if value is not None and name not in target.model_fields_set:
            setattr(target, name, value)
