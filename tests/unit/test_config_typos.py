"""A typo in model.json stops the start, naming file, key and the likely meaning: an
unknown key (``concurency``), a wrong type, a platform nothing runs (``comfyiu``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aigcq.cli.common import unknown_platform
from aigcq.config import ConfigError, PlatformConfig


def _load(tmp_path: Path, models: object) -> PlatformConfig:
    (tmp_path / "model.json").write_text(json.dumps(models))
    return PlatformConfig.load(tmp_path)


def test_an_unknown_key_is_refused_with_its_likely_meaning(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, {"proj": {"comfyui": {"apikey": "k", "concurency": 2}}})
    message = str(err.value)
    assert str(tmp_path / "model.json") in message and "'proj.comfyui.concurency'" in message
    assert message.endswith("did you mean 'concurrency'?")


def test_a_wrong_type_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'proj\.comfyui\.concurrency'"):
        _load(tmp_path, {"proj": {"comfyui": {"apikey": "k", "concurrency": "two"}}})


def test_a_platform_nothing_runs_is_named(tmp_path: Path) -> None:
    config = _load(tmp_path, {"proj": {"comfyiu": {"apikey": "k"}}})
    problem = unknown_platform(config)
    assert problem.startswith("proj.comfyiu: no platform 'comfyiu' (known: comfyui, coze")
    assert problem.endswith("did you mean 'comfyui'?")
    assert unknown_platform(_load(tmp_path, {"proj": {"comfyui": {"apikey": "k"}}})) == ""


def test_platform_json_and_code_json_refuse_what_they_cannot_mean(tmp_path: Path) -> None:
    (tmp_path / "Platform.json").write_text('{"callback": ["comfyui"], "poling": ["coze"]}')
    with pytest.raises(ConfigError, match=r"'poling'.*did you mean 'polling'\?"):
        PlatformConfig.load(tmp_path)
    (tmp_path / "Platform.json").unlink()
    (tmp_path / "code.json").write_text('{"TASK": {"TaskFailed": 5}}')
    with pytest.raises(ConfigError, match=r"'TASK\.TaskFailed': the message must be text"):
        PlatformConfig.load(tmp_path)
