"""aigcq's default ports, held while the suite runs: the README's second command (the tests)
runs beside its first (``aigcq up``, listening on 8087 and 8089), so no test may listen
on a default port, nor expect one to be free or to refuse connections.

``tests/conftest.py`` binds each one on 127.0.0.1 that is free, for the whole session, with
a socket that never listens: a test that binds the port fails at once ("already in use"),
as it would beside a running ``aigcq up``, and one that connects to it is refused, as if
nothing ran there. A port already taken (by ``aigcq up``, or by the session's first
process under xdist) stays as it is. Tests take free ports instead
(``tests.fakes.processes.Ports`` or ``reserved_port`` for a child process,
``tests.fakes.servers.bound_socket`` in-process) or port 0."""

from __future__ import annotations

import inspect
import socket

#: ports of other systems that aigcq's settings or docs name as defaults
OTHERS = {
    6379: "Redis",
    5432: "PostgreSQL",
    8080: "the original system's bridge port (AIGCQ_BRIDGE_PORT=8080)",
    23492: "the Go model-asynch's server.address",
}


def default_ports() -> dict[int, str]:
    """Every port an ``aigcq`` command listens on unless told otherwise, and what uses it,
    read from the settings and the command line (a new default is held at once)."""
    from aigcq.agent.settings import BridgeSettings
    from aigcq.asynch.settings import AsynchSettings
    from aigcq.cli.emulate import emulate_app
    from aigcq.config import Settings
    from aigcq.dispatcher.settings import DispatcherSettings

    def default(model: type[object], field: str) -> int:
        return int(model.model_fields[field].default)  # type: ignore[attr-defined]

    ports = {
        default(Settings, "ws_port"): "aigcq up / serve (AIGCQ_WS_PORT)",
        default(Settings, "callback_port"): "aigcq up / serve (AIGCQ_CALLBACK_PORT)",
        default(BridgeSettings, "http_port"): "aigcq bridge (AIGCQ_BRIDGE_HTTP_PORT)",
        default(DispatcherSettings, "port"): "aigcq dispatcher (AIGCQ_MD_PORT)",
        default(AsynchSettings, "port"): "aigcq asynch serve (AIGCQ_ASYNCH_PORT)",
    }
    for command in emulate_app.registered_commands:
        assert command.callback is not None
        port = inspect.signature(command.callback).parameters["port"].default
        ports[int(port)] = f"aigcq emulate {command.name}"
    return {**OTHERS, **ports}


def hold(ports: dict[int, str]) -> list[socket.socket]:
    """Bind each free one of ``ports`` on 127.0.0.1, without listening (see above)."""
    held = []
    for port in ports:
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:  # in use already: as good as held
            sock.close()
            continue
        held.append(sock)
    return held
