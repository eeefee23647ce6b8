"""Settings of the reference bridge (env ``AIGCQ_BRIDGE_*``, ``.env``, CLI options)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from aigcq.plumbing.http_limits import HttpLimits


class BridgeSettings(HttpLimits):
    """Every field reads ``AIGCQ_BRIDGE_<NAME>`` (e.g. ``AIGCQ_BRIDGE_SERVER``), except the
    bounds of its admin page's server, which read the same names as aigcq's
    (:class:`HttpLimits`)."""

    model_config = SettingsConfigDict(
        env_prefix="AIGCQ_BRIDGE_", env_file=".env", extra="ignore", case_sensitive=False
    )

    server: str = Field("ws://localhost:8080/ws", description="aigcq's bridge WebSocket URL.")
    token: str = Field("", description="Bridge token sent to aigcq.")
    comfyui: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8188"])
    host: str = "127.0.0.1"
    # AIGCQ_BRIDGE_HTTP_PORT, not AIGCQ_BRIDGE_PORT: the server reads that one (its extra
    # bridge port), and one .env may serve both on a host.
    http_port: int = Field(8190, description="Port of the admin page and output files.")
    public_url: str = Field("", description="Base of fileUrls; default http://<host>:<http_port>.")
    data_dir: Path = Path(".aigcq/bridge")
    files_ttl: float = Field(
        7 * 86400.0, gt=0, description="Seconds a result file's signed fileUrl stays valid."
    )
    workflows: Path | None = Field(None, description="Folder of <workflowId>.json files.")
    heartbeat: float = Field(30.0, gt=0, description="Seconds between HEARTBEATs.")
    slots_per_instance: int = Field(1, ge=1, description="Prompts run at once per instance.")
    affinity: bool = Field(
        True, description="Prefer the instance whose loaded models a task needs."
    )
    health_interval: float = Field(5.0, gt=0, description="Seconds between instance checks.")
    reconnect_max: float = Field(
        60.0, gt=0, description="Cap of the reconnect backoff while aigcq refuses the bridge."
    )
    reconnect_down_max: float = Field(
        2.0,
        gt=0,
        description="Cap of the reconnect backoff while aigcq cannot be reached (it is noticed "
        "within this long once it is back).",
    )
    ws_silence: float = Field(
        5.0,
        gt=0,
        description="Reconcile a prompt with /history and /queue when ComfyUI is silent this long.",
    )
    task_timeout: float = Field(3600.0, gt=0, description="Give up on a prompt after this.")
    progress_interval: float = Field(0.5, ge=0, description="Min seconds between TASK_PROGRESS.")
    webhook_max_delay: float = Field(60.0, gt=0, description="Cap of the TASK_END retry delay.")


def http_base(ws_url: str) -> str:
    """aigcq's HTTP base for a bridge WebSocket URL: ws→http, wss→https, path dropped."""
    parts = urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "", "", ""))
