"""Settings of our reference bridge (``aigcq.agent``) for tests: short intervals everywhere."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from aigcq.agent.settings import BridgeSettings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def quick_bridge(
    server: str, token: str, comfyui: list[str], data_dir: Path, **overrides: Any
) -> BridgeSettings:
    """Bridge settings for tests: its own port, short intervals everywhere."""
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
        http_port=free_port(),
        data_dir=data_dir,
        **(values | overrides),
    )
