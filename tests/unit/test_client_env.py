"""The client commands' tiny settings reader (``aigcq.cli.client_env``) and the full
:class:`aigcq.config.Settings` agree on names, defaults and where values come from, so that
they cannot drift apart (issue 29 item 6)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import AliasChoices

from aigcq.cli import client_env
from aigcq.config import Settings


def settings_of(tmp_path: Path) -> Settings:
    return Settings(_env_file=tmp_path / ".env")  # type: ignore[call-arg]


def test_every_field_has_the_names_and_default_of_its_setting() -> None:
    for name, (names, default) in client_env.FIELDS.items():
        field = Settings.model_fields[name]
        alias = field.validation_alias
        assert isinstance(alias, AliasChoices), name
        assert tuple(alias.choices) == names, name
        assert str(field.default) == default, name


def test_the_defaults_are_those_of_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for names, _ in client_env.FIELDS.values():
        for env_name in names:
            monkeypatch.delenv(env_name, raising=False)
    ours = client_env.read({}, tmp_path / ".env")
    full = settings_of(tmp_path)
    assert (ours.host, ours.ws_port, ours.admin_token, ours.data_dir) == (
        full.host,
        full.ws_port,
        full.admin_token,
        full.data_dir,
    )
    assert ours.secrets_file == full.secrets_file


ENV_FILES = [
    "AIGCQ_HOST=0.0.0.0\nAIGCQ_WS_PORT=9001\n",
    "export AIGCQ_HOST=10.0.0.2  # the LAN\nws_port=9002\nAIGCQ_ADMIN_TOKEN='a b#c'\n",
    '# comment\naigcq_data_dir="/srv/aigcq"\nAIGCQ_ADMIN_TOKEN="tok"\nWS_PORT = 9003\n',
    "WS_PORT=9004\nAIGCQ_WS_PORT=9005\n",  # the first name of the setting wins
]


@pytest.mark.parametrize("text", ENV_FILES)
def test_an_env_file_is_read_as_settings_reads_it(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for names, _ in client_env.FIELDS.values():
        for env_name in names:
            monkeypatch.delenv(env_name, raising=False)
    (tmp_path / ".env").write_text(text)
    ours = client_env.read({}, tmp_path / ".env")
    full = settings_of(tmp_path)
    assert (ours.host, ours.ws_port, ours.admin_token, ours.data_dir) == (
        full.host,
        full.ws_port,
        full.admin_token,
        full.data_dir,
    )


def test_the_environment_wins_over_the_env_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".env").write_text("AIGCQ_HOST=10.0.0.1\nAIGCQ_WS_PORT=9001\n")
    environ = {"aigcq_host": "10.0.0.9", "WS_PORT": "9100"}
    for names, _ in client_env.FIELDS.values():
        for env_name in names:
            monkeypatch.delenv(env_name, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    ours = client_env.read(environ, tmp_path / ".env")
    full = settings_of(tmp_path)
    assert (ours.host, ours.ws_port) == (full.host, full.ws_port) == ("10.0.0.9", 9100)


def test_a_port_that_is_no_number_is_refused(tmp_path: Path) -> None:
    with pytest.raises(client_env.ClientEnvError, match=r"^AIGCQ_WS_PORT: Input should be"):
        client_env.read({"AIGCQ_WS_PORT": "eighty"}, tmp_path / ".env")
