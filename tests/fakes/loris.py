"""Clients that hold a server's connections: silent sockets, slowloris heads, and a plain
request on a fresh connection to see what the server answers (blocking sockets, so the e2e
tests use them as they are and the in-process ones through ``asyncio.to_thread``)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

HOST = "127.0.0.1"
#: the connection limit of :data:`BOUNDS`
LIMIT = 8
#: the environment of a process under test: a 0.5 s head timeout, 8 connections (and idle
#: keep-alive connections kept a minute, to hold the limit)
BOUNDS = {
    "AIGCQ_HTTP_HEADER_TIMEOUT_S": "0.5",
    "AIGCQ_HTTP_KEEPALIVE_S": "60",
    "AIGCQ_MAX_CONNECTIONS": str(LIMIT),
}


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection((HOST, port), timeout=timeout)


def closed_by_server(sock: socket.socket, within: float = 20.0) -> bytes | None:
    """What the server sent before closing ``sock`` (``b""`` if nothing), or ``None`` if it
    was still open after ``within`` seconds."""
    sock.settimeout(within)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return got


def slowloris(port: int, *, every: float = 0.1, lines: int = 600) -> bytes | None:
    """Send a request head one header line every ``every`` seconds (``lines`` of them, never
    the blank line that ends it); what the server answered when it cut us off, or ``None``
    if it let the whole head trickle in."""
    with connect(port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        for i in range(lines):
            time.sleep(every)
            try:
                sock.sendall(b"X-Loris-%d: 1\r\n" % i)
            except (BrokenPipeError, ConnectionResetError):
                break
        else:
            return None
        return closed_by_server(sock, within=5.0)


@contextlib.contextmanager
def held(port: int, count: int, path: str | None = None) -> Iterator[list[socket.socket]]:
    """``count`` connections open for the ``with`` block: silent, or with ``path`` idle
    after one request (kept alive, so no head timeout applies)."""
    socks = [connect(port) for _ in range(count)]
    try:
        for sock in socks if path is not None else ():
            sock.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        yield socks
    finally:
        for s in socks:
            s.close()


def request(port: int, path: str = "/healthz", extra: bytes = b"") -> tuple[int, bytes]:
    """``GET path`` on a fresh connection: ``(status, the whole answer)``."""
    with connect(port) as sock:
        sock.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n" % (
            path.encode(), extra))  # fmt: skip
        answer = closed_by_server(sock) or b""
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    return status, answer


def check_bounded(port: int, probe: str) -> None:
    """The three bounds of ``plumbing/connection_limits.py`` on a running process."""
    with connect(port) as silent:
        assert closed_by_server(silent) == b""
    answer = slowloris(port)
    assert answer is not None and answer.startswith(b"HTTP/1.1 408 ")
    with held(port, LIMIT, path=probe):  # the probe is answered over the limit too
        status, answer = request(port, "/no-such-page")
        assert status == 503 and f"AIGCQ_MAX_CONNECTIONS={LIMIT}".encode() in answer
        assert request(port, probe)[0] == 200
    assert request(port, probe)[0] == 200
