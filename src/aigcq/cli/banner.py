"""What ``aigcq up`` prints on every start: where it listens, how in, where its secrets are."""

from __future__ import annotations

from aigcq.cli.common import console, local_host
from aigcq.config import PlatformConfig, Settings
from aigcq.plumbing.redis_address import redacted
from aigcq.serve.launch import listen_ports


def print_banner(settings: Settings, config: PlatformConfig, fresh: dict[str, str]) -> None:
    host, here = settings.host, local_host(settings.host)
    ports = listen_ports(settings)
    out = [f"[bold]aigcq[/bold] listening on {', '.join(f'{host}:{p}' for p in ports)}"]
    out.append(f"  clients    ws://{here}:{settings.ws_port}/?token=<token>&id=<backendId>")
    out.append(f"  HTTP API   http://{here}:{settings.ws_port}/docs")
    if settings.admin_token:  # a link to click: the token never goes through a shell
        dashboard = f"http://{here}:{settings.ws_port}/dashboard#token={settings.admin_token}"
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
    secrets = settings.secrets_file
    if secrets.exists():
        out.append(f"  secrets    {secrets.resolve()} (token secret, admin and bridge tokens)")
    for name, value in fresh.items():
        out.append(f"  generated {name}: [bold]{value}[/bold]")
    for line in out:
        console.print(line, soft_wrap=True, highlight=False)
