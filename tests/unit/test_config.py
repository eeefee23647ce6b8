"""Settings accept the seed's names; a bad platform file names its file, field and problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from aigcq.config import ConfigError, PlatformConfig, Settings


def test_seed_environment_names_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECT_PREFIX", "digitalHuman-test")
    monkeypatch.setenv("WS_PORT", "9087")
    monkeypatch.setenv("RunningHub_URL", "http://rh.local")
    monkeypatch.setenv("CALLBACK_URL", "https://cb.example/")
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    assert s.project_prefix == "digitalHuman-test"
    assert s.ws_port == 9087
    assert s.platform_url("runninghub") == "http://rh.local"
    assert s.public_callback_base() == "https://cb.example"


def test_aigcq_names_win_and_defaults_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIGCQ_WS_PORT", "7000")
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    assert s.ws_port == 7000 and s.callback_port == 8089


def test_seed_files_load(tmp_path: Path) -> None:
    (tmp_path / "model.json").write_text(
        '{"digitalHuman-test": {"comfyui": {"apikey": "a", "concurrency": 13},'
        ' "coze": {"apikey": "b", "concurrency": 20}}}'
    )
    (tmp_path / "Platform.json").write_text('{"callback": ["comfyui"], "polling": ["coze"]}')
    (tmp_path / "code.json").write_text('{"ERROR": {"JSONError": "bad json"}}')
    cfg = PlatformConfig.load(tmp_path)
    account = cfg.account("digitalHuman-test", "comfyui")
    assert account is not None and account.concurrency == 13
    assert cfg.kind_of("coze") == "polling"
    assert cfg.messages.get("JSONError") == "bad json"
    assert cfg.messages.get("AssessmentSuccess") == "任务提交成功，正在排队中..."


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("model.json", "{oops", "model.json: invalid JSON at line 1"),
        ("model.json", '{"p": {"comfyui": {"concurrency": -1}}}', "'p.comfyui.concurrency'"),
        ("model.json", '{"p": {"comfyui": {"concurrency": "many"}}}', "'p.comfyui.concurrency'"),
        ("model.json", '{"p": 3}', "field 'p' must be an object"),
        ("Platform.json", '{"polling": "coze"}', "Platform.json: field 'polling'"),
        ("code.json", '{"ERROR": 1}', "code.json: sections must be objects"),
    ],
)
def test_bad_files_name_file_field_and_problem(
    tmp_path: Path, name: str, content: str, expected: str
) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(ConfigError) as err:
        PlatformConfig.load(tmp_path)
    assert expected in str(err.value)
    assert str(tmp_path) in str(err.value)


def test_one_env_serves_the_server_and_a_bridge_without_a_port_clash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aigcq.agent.settings import BridgeSettings

    monkeypatch.setenv("AIGCQ_BRIDGE_PORT", "8080")  # the server's extra bridge port
    assert Settings(_env_file=None).bridge_port == 8080  # type: ignore[call-arg]
    assert BridgeSettings(_env_file=None).http_port == 8190  # type: ignore[call-arg]
    monkeypatch.setenv("AIGCQ_BRIDGE_HTTP_PORT", "8191")  # the bridge's admin page
    assert BridgeSettings(_env_file=None).http_port == 8191  # type: ignore[call-arg]


def test_serve_says_at_start_who_its_missing_secrets_turn_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from aigcq.serve.launch import warn_missing_secrets

    caplog.set_level("WARNING", logger="aigcq")
    warn_missing_secrets(Settings(_env_file=None), bridges=True)  # type: ignore[call-arg]
    assert "every client will be refused" in caplog.text
    assert "every bridge will be refused" in caplog.text
    caplog.clear()
    configured = Settings(_env_file=None, token_secret="s", bridge_token="b")  # type: ignore[call-arg]
    warn_missing_secrets(configured, bridges=True)
    warn_missing_secrets(Settings(_env_file=None, token_secret="s"), bridges=False)  # type: ignore[call-arg]
    assert caplog.text == ""


@pytest.mark.parametrize(
    ("name", "replacement"),
    [("AIGCQ_SCHEDULER", "AIGCQ_SHARES=false"), ("AIGCQ_SHARE_LOOKAHEAD", "every ready key")],
)
def test_a_setting_that_is_gone_is_refused_naming_its_replacement(
    monkeypatch: pytest.MonkeyPatch, name: str, replacement: str
) -> None:
    """Issue 37: one scheduler. A serve still configured for the old two is told so."""
    monkeypatch.setenv(name, "fair")
    with pytest.raises(ValueError, match=f"{name} is gone.*{replacement}"):
        Settings()
