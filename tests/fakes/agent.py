"""Settings of our reference bridge (``aigcq.agent``) for tests: short intervals everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aigcq.agent.app import Bridge
from aigcq.agent.settings import BridgeSettings


def quick_bridge(
    server: str, token: str, comfyui: list[str], data_dir: Path, **overrides: Any
) -> BridgeSettings:
    """Bridge settings for tests: short intervals everywhere, and ``http_port`` 0: the
    bridge's web server binds a free port itself as it starts (``Bridge.public_url`` says
    which), so no port is picked first and raced for."""
    values: dict[str, Any] = {
        "heartbeat": 0.3,
        "health_interval": 0.2,
        "reconnect_max": 0.5,
        "ws_silence": 0.3,
        "progress_interval": 0.0,
        "webhook_max_delay": 0.2,
    }
    return BridgeSettings(
        _env_file=None,  # type: ignore[call-arg]
        server=server,
        token=token,
        comfyui=comfyui,
        http_port=0,
        data_dir=data_dir,
        **(values | overrides),
    )


def same_port(settings: BridgeSettings, running: Bridge) -> BridgeSettings:
    """``settings`` for a restart of ``running`` on the port it listens on now (as a real
    bridge restarts on its configured port): URLs it handed out before keep working."""
    port = urlsplit(running.public_url).port
    assert port is not None, running.public_url
    return settings.model_copy(update={"http_port": port})
