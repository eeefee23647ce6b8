"""A parallel test's ``bind(0)`` against a port chosen for a child server, made certain:
run as ``python -m tests.fakes.port_race probe|reserve`` inside a network namespace of its
own (``unshare -n``) whose ephemeral range is one port, so that "another test binds port 0
meanwhile" always gets that port if the kernel will hand it out at all.

- ``probe``: the old way (bind port 0, read the number, close, hand the number over);
- ``reserve``: :class:`bench.processes.Ports`.

Then ``aigcq emulate runninghub --port N`` is started on the chosen port. Prints one JSON
line: what the other ``bind(0)`` got (``other``: its port, or null when refused) and whether
the child came up there (``served``), and again after a SIGKILL and a restart on the same
port (``restarted``)."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.processes import Ports, Proc

ONE_PORT = 40000


def _other_binds_port_0() -> tuple[int | None, socket.socket | None]:
    """A parallel test's server: bind port 0 and listen."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
    except OSError:
        sock.close()
        return None, None
    sock.listen()
    return int(sock.getsockname()[1]), sock


def _answers(port: int, source: int) -> bool:
    """Whether an HTTP server answers on ``port``, asked from the fixed ``source`` port (the
    only ephemeral one may be taken: a plain client could not connect at all)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.settimeout(1)
        try:
            sock.bind(("127.0.0.1", source))
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"GET /_emulator/stats HTTP/1.0\r\n\r\n")
            return sock.recv(12).startswith(b"HTTP/1.")
        except OSError:
            return False


def _serves(port: int, tmp: Path) -> tuple[Proc, bool]:
    """Start the emulator on ``port``; whether it comes up there within 20 s."""
    proc = Proc(["emulate", "runninghub", "--port", str(port)], {}, tmp / "emulator.log").start()
    assert proc.p is not None
    deadline = time.monotonic() + 20
    for source in itertools.count(ONE_PORT + 1000):
        if proc.p.poll() is not None or time.monotonic() > deadline:
            return proc, False
        if _answers(port, source):
            return proc, True
        time.sleep(0.1)
    raise AssertionError("unreachable")


def main(mode: str) -> dict[str, object]:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    Path("/proc/sys/net/ipv4/ip_local_port_range").write_text(f"{ONE_PORT} {ONE_PORT}")
    ports = Ports()
    if mode == "probe":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
    else:
        port = ports.take()
    other, held = _other_binds_port_0()
    with tempfile.TemporaryDirectory() as tmp:
        proc, served = _serves(port, Path(tmp))
        proc.kill()
        again, restarted = _serves(port, Path(tmp))
        again.stop()
    if held is not None:
        held.close()
    ports.close()
    return {"port": port, "other": other, "served": served, "restarted": restarted}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
