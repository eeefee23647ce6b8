"""Ports: is one free (every ``aigcq`` process asks before it prints where it listens), and
ports reserved for child servers until given back (:class:`Ports`)."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable


def bind_problem(host: str, port: int, *, reuse_port: bool = False) -> str | None:
    """Why ``host:port`` cannot be listened on (``"in use"``...), or None when it can.
    ``reuse_port``: the server shares the port with its sibling workers (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "already in use"
            return exc.strerror or str(exc)
    return None


def busy_port(
    host: str, ports: Iterable[tuple[int, str]], *, reuse_port: bool = False
) -> str | None:
    """The first of ``ports`` (each with the setting that moves it) that cannot be listened
    on, as one sentence naming the port and the setting; None when all are free. Port 0
    (any free port) is skipped."""
    for port, setting in ports:
        if not port:
            continue
        problem = bind_problem(host, port, reuse_port=reuse_port)
        if problem is not None:
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            return f"cannot listen on {where}: {problem} (set {setting} to use another port)"
    return None


def local_host(host: str) -> str:
    """An address this machine reaches ``host`` at (the loopback for a wildcard), bracketed
    when IPv6, ready for a URL."""
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host) or host
    return f"[{host}]" if ":" in host else host


class Ports:
    """Ports for child servers, each reserved until :meth:`close` (``with Ports() as
    ports:``), so that none is taken between the moment it is chosen and the moment the
    child listens, nor while a killed child is restarted on it.

    :meth:`take` binds port 0 with ``SO_REUSEADDR`` and keeps the socket, never listening.
    On Linux, the kernel then hands that port to no other ``bind(0)`` nor outgoing
    connection (a test's server or client on a parallel xdist worker), while a child that
    binds it with ``SO_REUSEADDR`` too (aigcq's servers, uvicorn, asyncio, redis-server and
    Go all do) may listen on it: the reservation is what closing a probed port and handing
    its number over (a "free port") lacked. Run every child on 127.0.0.1."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._held: list[socket.socket] = []

    def take(self) -> int:
        """A port of this reservation's own: pass it to the child's ``--port``."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self._held.append(sock)
        return int(sock.getsockname()[1])

    def close(self) -> None:
        """Give the ports back (stop their children first)."""
        while self._held:
            self._held.pop().close()

    def __enter__(self) -> Ports:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
