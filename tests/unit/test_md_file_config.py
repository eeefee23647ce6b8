"""config/messageDispatcher.json: the seed's shape, env wins, clear errors."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from aigcq.config import ConfigError, Settings
from aigcq.health import Health, HealthState
from aigcq.mdclient.file_config import apply_md_file, load_md_file
from aigcq.mdclient.settings import MdClientSettings
from aigcq.mdclient.target import internal_target
from aigcq.platforms.md_auth import JwtManager

SEED = {
    "enabled": True,
    "priority": True,
    "healthCheck": {"interval": 10000, "timeout": 5000, "failureThreshold": 3},
    "task": {"timeout": 30000, "retryCount": 1},
    "capacity": {"internal": 30, "external": 10},
    "jwt": {"refreshInterval": 72000000},
}


def _write(tmp_path: Path, content: object) -> Path:
    (tmp_path / "messageDispatcher.json").write_text(json.dumps(content))
    return tmp_path


def test_no_file_is_none(tmp_path: Path) -> None:
    assert load_md_file(tmp_path) is None


def test_seed_file_fills_what_the_environment_does_not_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MESSAGE_DISPATCHER_TIMEOUT", "1234")
    monkeypatch.setenv("EXTERNAL_CAPACITY_MAX", "3")
    file = load_md_file(_write(tmp_path, {**SEED, "healthCheck": {"interval": 500}}))
    assert file is not None
    md, settings = MdClientSettings(), Settings()
    apply_md_file(file, md, settings)
    assert md.timeout_ms == 1234 and md.health_check_interval_ms == 500
    assert md.health_check_timeout_ms == 5000 and md.jwt_refresh_interval_ms == 72000000
    assert settings.internal_capacity_max == 30 and settings.external_capacity_max == 3


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ({"capacity": {"internal": -1}}, "capacity.internal"),
        ({"healthCheck": {"intervall": 5}}, "healthCheck.intervall"),
        ({"enabled": "maybe"}, "enabled"),
    ],
)
def test_bad_file_names_file_and_field(tmp_path: Path, content: object, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"messageDispatcher\.json: field '{field}'"):
        load_md_file(_write(tmp_path, content))


def test_not_json_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "messageDispatcher.json").write_text("{nope")
    with pytest.raises(ConfigError, match=r"messageDispatcher\.json: invalid JSON"):
        load_md_file(tmp_path)


def test_refresh_interval_brings_the_next_login_forward() -> None:
    manager = JwtManager("http://md", "u", "p", refresh_every_s=3600)
    manager.lifetime_s, manager.expires_at = 86400.0, time.time() + 86400
    assert 3590 < manager.refresh_in() <= 3600
    manager.refresh_every_s = None
    assert 71990 < manager.refresh_in() <= 72000  # 4 h ahead of a 24 h token


def test_priority_threshold_and_retry_count_are_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MESSAGE_DISPATCHER_RETRY_COUNT", "4")
    content = {**SEED, "priority": False}
    file = load_md_file(_write(tmp_path, content))
    assert file is not None
    md = MdClientSettings()
    apply_md_file(file, md, Settings())
    assert md.priority is False and md.health_check_failure_threshold == 3
    assert md.retry_count == 4  # the environment wins
    monkeypatch.delenv("MESSAGE_DISPATCHER_RETRY_COUNT")
    defaults = MdClientSettings()
    assert defaults.priority is True and defaults.health_check_failure_threshold == 1
    assert defaults.retry_count == 0


def test_failure_threshold_counts_checks_but_a_submit_failure_degrades_at_once() -> None:
    health = Health(recover_passes=2, failure_threshold=3)
    assert health.observe("down") is None and health.observe("down") is None
    assert health.healthy
    assert health.observe("") is None  # a pass resets the count
    assert health.observe("down") is None and health.observe("down") is None
    assert health.observe("down") is HealthState.DEGRADED
    assert health.observe("") is HealthState.RECOVERING
    assert health.observe("down") is HealthState.DEGRADED  # not healthy: at once
    assert health.observe("") is HealthState.RECOVERING
    assert health.observe("") is HealthState.HEALTHY
    assert health.observe("submit failed", immediate=True) is HealthState.DEGRADED
    assert health.degrades == 2 and health.recovers == 1


def test_a_dispatcher_url_without_its_password_is_said_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("MD_PASSWORD", "AIGCQ_MD_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no .env here
    settings = Settings(config_dir=tmp_path, message_dispatcher_url="http://md:8080")
    with caplog.at_level(logging.ERROR, logger="aigcq.mdclient.target"):
        assert internal_target(settings) is not None
    assert "MD_PASSWORD is unset" in caplog.text and "no internal capacity" in caplog.text
