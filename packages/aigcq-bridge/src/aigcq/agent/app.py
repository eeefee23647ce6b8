"""The reference bridge, wired together: ``aigcq bridge``.

``async with Bridge(settings) as bridge:`` starts the HTTP server, the instance checks and
WebSockets, the hub link, and re-sends spooled results; leaving the block stops it all.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal
import time
import uuid
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from aigcq.agent.connection import HubLink, redact
from aigcq.agent.following import RunnerSettings
from aigcq.agent.http_server import HttpServer
from aigcq.agent.instances import ComfyInstance, InstancePool
from aigcq.agent.runner import TaskRunner
from aigcq.agent.settings import BridgeSettings, http_base
from aigcq.agent.spool import Spool, WebhookSender
from aigcq.agent.web import FILES, bridge_routes
from aigcq.agent.workflow import WorkflowSource
from aigcq.observability import tracing
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import Spawner
from aigcq.plumbing.cancel import cancel_and_wait
from aigcq.wire.bridge import (
    BridgeMessage,
    CapacityData,
    CapacityMessage,
    HeartbeatData,
    HeartbeatMessage,
    RegisterData,
    RegisterMessage,
    TaskAssignData,
    utc_timestamp,
)
from aigcq.wire.links import signed_url

log = logging.getLogger(__name__)


def bridge_version() -> str:
    """The installed ``aigcq-bridge``'s version, as REGISTER reports it ("0+source" when run
    from a checkout that is not installed)."""
    try:
        return metadata.version("aigcq-bridge")
    except metadata.PackageNotFoundError:
        return "0+source"


def load_file_key(data_dir: Path) -> bytes:
    """The key of the bridge's fileUrl signatures, created once and kept (mode 600) in
    ``<data dir>/files.key``: links handed out stay valid across restarts."""
    path = data_dir / "files.key"
    if path.is_file() and (existing := path.read_text().strip()):
        return bytes.fromhex(existing)
    key = secrets.token_bytes(32)
    path.touch(mode=0o600)
    path.write_text(key.hex() + "\n")
    return key


def load_bridge_id(data_dir: Path) -> str:
    """The bridge's id, created once and kept in ``<data dir>/bridge_id``."""
    path = data_dir / "bridge_id"
    if path.is_file() and (existing := path.read_text().strip()):
        return existing
    bridge_id = str(uuid.uuid4())
    path.write_text(bridge_id + "\n")
    return bridge_id


class Bridge:
    """One bridge process: fronts ``settings.comfyui`` instances for aigcq."""

    def __init__(self, settings: BridgeSettings) -> None:
        self.settings = settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.bridge_id = load_bridge_id(settings.data_dir)
        self.token = settings.token
        self.files_dir = settings.data_dir / "files"
        self.file_key = load_file_key(settings.data_dir)
        self.public_url = settings.public_url.rstrip("/")
        self.http = httpx.AsyncClient(timeout=30.0)
        self.pool = InstancePool(
            [
                ComfyInstance(url, self.http, self.bridge_id, settings.slots_per_instance)
                for url in settings.comfyui
            ]
        )
        self.sender = WebhookSender(
            self.http, Spool(settings.data_dir / "spool"), settings.webhook_max_delay
        )
        self.source = WorkflowSource(
            self.http, http_base(settings.server), settings.token, settings.workflows
        )
        self.runner = TaskRunner(
            self.pool,
            self.source,
            self.sender,
            self._send,
            self.files_dir,
            self.file_url,
            RunnerSettings(
                settings.ws_silence,
                settings.task_timeout,
                settings.progress_interval,
                settings.affinity,
            ),
        )
        self.link = HubLink(
            settings.server,
            settings.token,
            self.bridge_id,
            settings.heartbeat,
            settings.reconnect_max,
            self._register_message,
            self._heartbeat_message,
            self._on_assign,
            self.runner.cancel,
            settings.reconnect_down_max,
            self.sender.wake,  # the hub is back: undelivered TASK_ENDs now
        )
        self._web = HttpServer(bridge_routes(self), settings, f"bridge {self.bridge_id}")
        self._tasks: list[asyncio.Task[Any]] = []
        self._changes = Spawner()
        for instance in self.pool.instances:
            instance.on_change = self._instances_changed
        self._seq = 0  # of CAPACITY reports, this process
        self.runner.on_free = self._slot_freed

    # -- messages --
    async def _send(self, msg: BridgeMessage) -> bool:
        return await self.link.send(msg)

    def _instances_changed(self) -> None:
        """An instance came back or went away: tell aigcq now (a HEARTBEAT out of turn)."""
        if self.link.state == "connected":
            self._changes(self._beat_now())

    def _slot_freed(self) -> None:
        """An instance let a prompt go (finished, or stopped after a cancel): CAPACITY."""
        if self.link.state == "connected":
            self._changes(self._send_capacity())

    async def _send_capacity(self) -> None:
        await self._send(self._capacity_message())  # built when sent, as a HEARTBEAT

    def _capacity_message(self) -> CapacityMessage:
        self._seq += 1
        return CapacityMessage(data=CapacityData(seq=self._seq, **self._state()))

    def _state(self) -> dict[str, Any]:
        """What a HEARTBEAT and a CAPACITY report: counts, instances, held tasks, now."""
        total, free, busy = self.pool.counts()
        return {
            "instance_count": total,
            "available_instance_count": free,
            "busy_instance_count": busy,
            "timestamp": utc_timestamp(),
            "instances": self.pool.infos(),
            "tasks": self.runner.held(),
        }

    async def _beat_now(self) -> None:
        # built when sent, not when asked for: a stale task list would tell aigcq that a
        # task acknowledged in between has ended
        await self._send(self._heartbeat_message())

    async def _on_assign(self, assign: TaskAssignData) -> None:
        await self.runner.handle(assign)

    def _register_message(self) -> RegisterMessage:
        total, free, _ = self.pool.counts()
        data = RegisterData(
            bridge_id=self.bridge_id,
            instance_count=total,
            available_instance_count=free,
            timestamp=utc_timestamp(),
            instances=self.pool.infos(),
            tasks=self.runner.held(),
            version=bridge_version(),
            capacity_reports=True,
        )
        return RegisterMessage(data=data)

    def _heartbeat_message(self) -> HeartbeatMessage:
        return HeartbeatMessage(data=HeartbeatData(**self._state()))

    # -- control (used by the admin page) --
    async def set_server(self, url: str) -> None:
        self.source.registry_base = http_base(url)
        await self.link.set_server(url)

    def status(self) -> dict[str, Any]:
        total, free, busy = self.pool.counts()
        now = time.monotonic()
        return {
            "bridgeId": self.bridge_id,
            "server": redact(self.link.url),
            "connection": {
                "state": self.link.state,
                "since": self.link.since,
                "lastError": self.link.last_error,
            },
            "instanceCount": total,
            "availableInstanceCount": free,
            "busyInstanceCount": busy,
            "instances": [i.model_dump() for i in self.pool.infos()],
            "tasks": [
                {
                    "taskId": t.task_id,
                    "promptId": t.prompt_id,
                    "instanceId": t.instance.instance_id,
                    "progress": t.progress,
                    "seconds": round(now - t.started, 1),
                }
                for t in self.runner.running.values()
            ],
            "spooled": self.sender.spool.task_ids(),
        }

    def file_url(self, task_id: str, name: str) -> str:
        """The signed, expiring link to a result file of ``task_id`` (settings.files_ttl)."""
        expires = int(time.time() + self.settings.files_ttl)
        return signed_url(self.public_url, self.file_key, f"{task_id}/{name}", expires, FILES)

    # -- lifecycle --
    async def start(self) -> None:
        self.files_dir.mkdir(parents=True, exist_ok=True)
        await self._start_web()
        await self.pool.check_all()
        self._spawn(self.pool.health_loop(self.settings.health_interval), "health")
        for instance in self.pool.instances:
            self._spawn(instance.listen(), f"comfyui-ws-{instance.instance_id}")
            self._spawn(instance.forget_loop(), f"comfyui-history-{instance.instance_id}")
        for held in self.runner.held_prompts():  # claimed before REGISTER lists them
            self._spawn(self.runner.readopt(held), f"readopt-{held.task_id}")
        self._spawn(self.link.run(), "hub-link")
        resent = await self.sender.resend_spooled()
        log.info(
            "bridge %s: started, %d instance(s), %d spooled result(s) to re-send, files at %s",
            self.bridge_id,
            len(self.pool.instances),
            resent,
            self.public_url,
            extra=ctx(bridge=self.bridge_id),
        )

    def _spawn(self, coro: Any, name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=name))

    async def _start_web(self) -> None:
        s = self.settings
        try:
            port = await self._web.start(s.host, s.http_port)
        except OSError as exc:
            where = f"{s.host}:{s.http_port}"
            raise RuntimeError(f"bridge {self.bridge_id}: cannot listen on {where}") from exc
        if not self.public_url:
            self.public_url = f"http://{s.host}:{port}"
            if s.host in ("0.0.0.0", "::"):
                log.warning(
                    "bridge %s: set --public-url; fileUrls use %s",
                    self.bridge_id,
                    s.host,
                    extra=ctx(bridge=self.bridge_id),
                )

    async def stop(self) -> None:
        await self._web.close()
        await self.link.close()
        await self.sender.close()
        await cancel_and_wait(self._tasks)
        self._tasks.clear()
        await self.http.aclose()
        log.info("bridge %s: stopped", self.bridge_id, extra=ctx(bridge=self.bridge_id))

    async def __aenter__(self) -> Bridge:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


async def serve(settings: BridgeSettings) -> None:
    """Run a bridge until SIGINT or SIGTERM (or cancellation), then stop it cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with tracing.in_process("aigcq-bridge"), Bridge(settings):
        await stop.wait()


def run(settings: BridgeSettings) -> None:
    """Blocking entry point for ``aigcq bridge``."""
    asyncio.run(serve(settings))
