"""What ``aigcq up`` prints on every start: where it listens, how in, where its secrets are."""

from __future__ import annotations

from aigcq.cli.common import console, generated_line, on_terminal
from aigcq.config import PlatformConfig, Settings
from aigcq.plumbing.ports import local_host
from aigcq.plumbing.redis_address import redacted
from aigcq.serve.launch import listen_ports


def dashboard_link(settings: Settings, here: str) -> str:
    """The dashboard with the admin token after ``#``: a link to click, so the token never
    goes through a shell, and never to the server (nor its logs). Only on a terminal: a
    banner written to a log names where the token is instead. ``""`` without a token."""
    if not settings.admin_token:
        return ""
    page = f"http://{here}:{settings.ws_port}/dashboard"
    if on_terminal():
        return f"{page}#token={settings.admin_token}"
    return f"{page} (its admin token: AIGCQ_ADMIN_TOKEN, or admin_token in the secrets file)"


def secrets_note(settings: Settings) -> str:
    """Where ``aigcq up`` keeps the secrets it generated (``""``: it generated none)."""
    path = settings.secrets_file
    if not path.exists():
        return ""
    return f"{path.resolve()} (token secret, admin and bridge tokens)"


def print_banner(settings: Settings, config: PlatformConfig, fresh: dict[str, str]) -> None:
    host, here = settings.host, local_host(settings.host)
    ports = listen_ports(settings)
    out = [f"[bold]aigcq[/bold] listening on {', '.join(f'{host}:{p}' for p in ports)}"]
    out.append(f"  clients    ws://{here}:{settings.ws_port}/?token=<token>&id=<backendId>")
    out.append(f"  HTTP API   http://{here}:{settings.ws_port}/docs")
    if dashboard := dashboard_link(settings, here):
        out.append(f"  dashboard  {dashboard}")
    out.append(f"  callbacks  {settings.public_callback_base()}/callback/all")
    embedded = f"embedded, data in {settings.data_dir}"
    redis = redacted(settings.redis_url) if settings.redis_url else embedded
    out.append(f"  redis      {redis}")
    out.append(f"  config     {settings.config_dir}/ and ./.env, read now (restart after a change)")
    if config.queues():
        out.append("  platforms  " + ", ".join(f"{a}/{p}" for a, p in config.queues()))
    else:
        out.append(f"  [yellow]no platforms configured: add {settings.config_dir}/model.json[/]")
    if secrets := secrets_note(settings):
        out.append(f"  secrets    {secrets}")
    kept = str(settings.secrets_file.resolve())
    out += [generated_line(name, value, kept) for name, value in fresh.items()]
    for line in out:
        console.print(line, soft_wrap=True, highlight=False)
