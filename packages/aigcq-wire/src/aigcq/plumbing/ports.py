"""Is a port free? Every ``aigcq`` process asks before it prints where it listens."""

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
