"""Starting a server process: secrets, embedded Redis, sockets, uvicorn."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import secrets
import signal
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import uvicorn

from aigcq.config import NO_SIGNING_KEY, PlatformConfig, Settings
from aigcq.embedded.ownership import EmbeddedServerError
from aigcq.embedded.redis import EmbeddedRedis
from aigcq.observability import tracing
from aigcq.plumbing.connection_limits import bounded_config
from aigcq.plumbing.redis_client import redis_client

log = logging.getLogger(__name__)

GENERATED = ("token_secret", "admin_token", "bridge_token")


def ensure_secrets(
    settings: Settings,
    owner: object | None = None,
    names: tuple[str, ...] = GENERATED,
    key_prefix: str = "",
) -> dict[str, str]:
    """Fill unset secrets from ``<data_dir>/secrets.json``, generating them the first time.

    ``owner`` (default ``settings``) holds the attributes ``names``; they are stored under
    ``key_prefix + name``. Returns the secrets generated just now (to print once).
    """
    owner = settings if owner is None else owner
    path = settings.secrets_file
    stored = settings.stored_secrets()
    fresh: dict[str, str] = {}
    for name in names:
        if getattr(owner, name):
            continue
        key = key_prefix + name
        value = stored.get(key) or secrets.token_urlsafe(24)
        if key not in stored:
            fresh[key] = value
            stored[key] = value
        setattr(owner, name, value)
    if fresh:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored, indent=2))
        path.chmod(0o600)
    return fresh


def bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # several worker processes on one port; the kernel spreads connections
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def listen_ports(settings: Settings) -> list[int]:
    return [port for port, _ in listen_settings(settings)]


def listen_settings(settings: Settings) -> list[tuple[int, str]]:
    """The ports a server listens on, each with the setting that moves it (once each)."""
    named = [
        (settings.ws_port, "AIGCQ_WS_PORT"),
        (settings.callback_port, "AIGCQ_CALLBACK_PORT"),
        (settings.bridge_port, "AIGCQ_BRIDGE_PORT"),
    ]
    ports = [p for p, _ in named]
    return [(p, name) for i, (p, name) in enumerate(named) if p and p not in ports[:i]]


class _Server(uvicorn.Server):
    """Calls ``on_started`` once it listens (its app started), ``on_exit`` as soon as
    SIGTERM / SIGINT arrives, before connections close."""

    on_started: Callable[[], None] | None = None
    on_exit: Callable[[], None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.on_started is not None:
            self.on_started()

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.on_exit is not None:
            self.on_exit()
        super().handle_exit(sig, frame)


def uvicorn_server(
    app: Any,
    settings: Settings,
    on_exit: Callable[[], None] | None = None,
    on_started: Callable[[], None] | None = None,
) -> uvicorn.Server:
    """A uvicorn server for one of our apps (sockets are passed to ``serve``);
    ``on_exit`` runs first thing on SIGTERM / SIGINT (e.g. stop claiming tasks),
    ``on_started`` once it listens.

    No access log (a line per callback is noise at thousands a second) and no WebSocket
    compression (small JSON messages; deflate only costs CPU on both ends). Bounded by the
    settings' head timeout, keep-alive, connection limit and pings
    (:mod:`aigcq.plumbing.connection_limits`).
    """
    server = _Server(
        bounded_config(
            app,
            settings,
            log_config=None,
            access_log=False,
            ws_per_message_deflate=False,
            ws_max_size=max(settings.max_payload_bytes * 2, 1 << 20),
            timeout_graceful_shutdown=10,
        )
    )
    server.on_exit, server.on_started = on_exit, on_started
    return server


async def serve(
    settings: Settings, config: PlatformConfig, on_listening: Callable[[], None] | None = None
) -> None:
    """Run ``aigcq serve`` until SIGINT/SIGTERM, then shut down cleanly; ``on_listening``
    once it listens."""
    from aigcq.mdclient.target import internal_target
    from aigcq.serve.server import ServeProcess
    from aigcq.serve.shutdown import stop_claiming

    internal = internal_target(settings)
    warn_missing_secrets(settings, bridges=internal is None)
    async with tracing.in_process("aigcq"):
        redis = redis_client(settings.redis_url)
        service = ServeProcess(settings, config, redis, internal=internal)
        sockets = [
            bind(settings.host, port, reuse_port=settings.reuse_port)
            for port in listen_ports(settings)
        ]
        stop = lambda: stop_claiming(service)  # noqa: E731
        server = uvicorn_server(service.app, settings, on_exit=stop, on_started=on_listening)
        try:
            await server.serve(sockets=sockets)
        finally:
            await redis.aclose()


def require_signing_key(settings: Settings) -> None:
    """Refuse to start without a key for webhook URLs: with an empty one anyone could sign
    a TASK_END (``up`` generates TOKEN_SECRET; several ``serve`` processes share one)."""
    if not settings.signing_key():
        log.error("%s", NO_SIGNING_KEY)
        raise SystemExit(2)


def warn_missing_secrets(settings: Settings, *, bridges: bool) -> None:
    """``aigcq serve`` takes its secrets from the environment (``up`` generates them): say
    at start-up, not at each refusal, who will be turned away (``bridges``: this process
    takes bridges, i.e. no message-dispatcher is its internal target)."""
    if not settings.token_secret and not settings.client_tokens:
        log.warning("no TOKEN_SECRET and no AIGCQ_CLIENT_TOKENS: every client will be refused")
    if bridges and not settings.bridge_token and not settings.admin_token:
        log.warning("no AIGCQ_BRIDGE_TOKEN: every bridge will be refused")


def run_async(main: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop (shipped with uvicorn[standard]) when available."""
    tune_gc()
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def tune_gc() -> None:
    """Fewer, shorter garbage collections for a long-running server.

    What start-up allocated (modules, app, settings) lives as long as the process: freeze
    it, so no full collection walks it again. A request allocates far more than the
    default 700 objects between young-generation collections; collecting every 20,000
    cuts collections 30-fold, which removes their pauses from the latency tail.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def run_with_redis(
    settings: Settings,
    config: PlatformConfig,
    *,
    embedded_dir: Path,
    main: Callable[[], Coroutine[Any, Any, None]] | None = None,
    on_listening: Callable[[], None] | None = None,
) -> None:
    """Serve (or run ``main``); start a private Redis first when no ``AIGCQ_REDIS_URL``.
    ``on_listening``: called once the server listens (a worker of several: the first)."""
    if main is None:
        require_signing_key(settings)
    embedded: EmbeddedRedis | None = None
    if not settings.redis_url:
        embedded = EmbeddedRedis(embedded_dir)
        settings.redis_url = start_private(embedded.start)
    exit_on_sigterm()
    started = True
    try:
        if main is None and settings.workers > 1:
            from aigcq.serve.workers import supervise

            started = supervise(settings, on_listening)
        else:
            run_async(main() if main else serve(settings, config, on_listening))
    except (KeyboardInterrupt, SignalExit):
        log.info("stopped by signal")
    finally:
        if embedded is not None:
            embedded.stop()
    if not started:
        raise SystemExit(1)


def start_private(start: Callable[[], str]) -> str:
    """Start a private server; when it cannot start, say why in one line and exit 1."""
    try:
        return start()
    except EmbeddedServerError as exc:
        log.error("%s", exc)
        raise SystemExit(1) from None


def exit_on_sigterm() -> None:
    """Make SIGTERM raise :class:`SignalExit`, as SIGINT raises KeyboardInterrupt.

    uvicorn re-raises the signal once it has shut down; with the default handler SIGTERM would
    end the process there, skipping the ``finally`` blocks that stop the private servers."""
    signal.signal(signal.SIGTERM, _exit_on_signal)


class SignalExit(SystemExit):
    """SIGTERM arrived (see :func:`exit_on_sigterm`)."""


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SignalExit(128 + signum)
