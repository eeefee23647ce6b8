"""Where Redis is: the ``redis+sentinel://`` URL and the AIGCQ_REDIS_SENTINELS settings are
read alike; a malformed one stops start-up with a message naming the setting."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from aigcq.cli.app import app
from aigcq.config import Settings
from aigcq.plumbing.redis_address import (
    RedisAddressError,
    parse_sentinel_url,
    redacted,
    sentinel_url,
)
from aigcq.plumbing.redis_client import BlockingSentinelPool, redis_client


def _settings() -> Settings:
    return Settings(_env_file=None)  # type: ignore[call-arg]


def test_the_url_names_sentinels_master_db_and_credentials() -> None:
    url = "redis+sentinel://app:p%40ss@s1:5000,s2,[::1]:5002/mymaster/2?socket_timeout=0.5&sentinel_password=sp"
    a = parse_sentinel_url(url)
    assert a.sentinels == (("s1", 5000), ("s2", 26379), ("::1", 5002))
    assert a.master == "mymaster"
    assert a.options == {"db": 2, "username": "app", "password": "p@ss", "socket_timeout": 0.5}
    assert a.sentinel_options == {"password": "sp", "socket_timeout": 0.5}


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://s1:5000", "no master name"),
        ("redis+sentinel:///mymaster", "no sentinels given"),
        ("redis+sentinel://s1:port/mymaster", "bad port"),
        ("redis+sentinel://s1:5000/mymaster/zero", "not a number"),
    ],
)
def test_a_malformed_url_is_refused_saying_why(url: str, says: str) -> None:
    with pytest.raises(RedisAddressError, match=says):
        parse_sentinel_url(url)


def test_the_settings_compose_the_same_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIGCQ_REDIS_SENTINELS", "s1:5000, s2:5001")
    monkeypatch.setenv("AIGCQ_REDIS_MASTER", "mymaster")
    monkeypatch.setenv("AIGCQ_REDIS_PASSWORD", "p/w")
    monkeypatch.setenv("AIGCQ_REDIS_SENTINEL_PASSWORD", "sp")
    url = _settings().redis_url
    assert url == "redis+sentinel://:p%2Fw@s1:5000,s2:5001/mymaster/0?sentinel_password=sp"
    assert parse_sentinel_url(url).options["password"] == "p/w"
    monkeypatch.setenv("AIGCQ_REDIS_URL", url)  # what a supervisor passes its workers
    assert _settings().redis_url == url


def test_sentinels_without_a_master_or_beside_another_url_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIGCQ_REDIS_SENTINELS", "s1:5000")
    with pytest.raises(ValidationError, match="AIGCQ_REDIS_MASTER: master name ''"):
        _settings()
    monkeypatch.setenv("AIGCQ_REDIS_MASTER", "mymaster")
    monkeypatch.setenv("AIGCQ_REDIS_URL", "redis://other:6379/0")
    with pytest.raises(ValidationError, match="both set and differ"):
        _settings()


def test_a_command_stops_at_start_up_on_a_bad_sentinel_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIGCQ_REDIS_URL", "redis+sentinel://s1:5000")
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code == 2
    assert "AIGCQ_REDIS_URL:" in result.output and "no master name" in result.output


def test_passwords_never_reach_a_log_line() -> None:
    shown = redacted(sentinel_url("s1:1", "m", password="secret1", sentinel_password="secret2"))
    assert "secret" not in shown and shown.startswith("redis+sentinel://:***@s1:1/m/0")


def test_a_sentinel_url_makes_a_blocking_sentinel_pool() -> None:
    client = redis_client("redis+sentinel://127.0.0.1:1/mymaster/3")
    pool = client.connection_pool
    assert isinstance(pool, BlockingSentinelPool)
    assert pool.service_name == "mymaster" and pool.connection_kwargs["db"] == 3
