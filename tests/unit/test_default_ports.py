"""The suite holds aigcq's default ports while it runs (``tests/fakes/default_ports.py``):
a test that listens on one fails here as it would beside the README's ``aigcq up``."""

from __future__ import annotations

import errno
import socket

import pytest

from tests.fakes.default_ports import default_ports, hold
from tests.fakes.servers import closed_port


def test_the_defaults_are_read_from_the_commands() -> None:
    ports = default_ports()
    assert {8087, 8089, 8091, 8190, 4000, 8188, 9101, 9102, 9103} <= set(ports), ports
    assert "AIGCQ_WS_PORT" in ports[8087] and ports[9101] == "aigcq emulate runninghub"


@pytest.mark.parametrize("port", sorted(default_ports()))
def test_no_test_can_listen_on_a_default_port(port: int) -> None:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        with pytest.raises(OSError) as refused:
            sock.bind(("127.0.0.1", port))
    assert refused.value.errno == errno.EADDRINUSE


def test_a_held_port_refuses_connections() -> None:
    """As an unused port would: a client test sees nothing there, not a hung server."""
    with closed_port() as port:
        pass  # a port that was free a moment ago
    [held] = hold({port: "a test"})
    with held, socket.socket() as sock, pytest.raises(ConnectionRefusedError):
        sock.connect(("127.0.0.1", port))
