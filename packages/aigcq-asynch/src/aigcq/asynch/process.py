"""The asynch service's parts, wired together and opened/closed as one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx
import redis.asyncio as aioredis

from aigcq.asynch.admission import Admission
from aigcq.asynch.callback import Callbacks
from aigcq.asynch.cleaner import Cleaner
from aigcq.asynch.db import Pool, open_pool
from aigcq.asynch.executor import Executor
from aigcq.asynch.gate import QueueGate
from aigcq.asynch.invoke import model_session
from aigcq.asynch.models_repo import ModelRepo
from aigcq.asynch.rebuild import Rebuilder
from aigcq.asynch.semaphore import Semaphore
from aigcq.asynch.settings import AsynchSettings
from aigcq.asynch.tasks_repo import TaskRepo
from aigcq.asynch.types_repo import ModelTypeRepo
from aigcq.asynch.worker import Worker
from aigcq.plumbing.background import one_round, round_failed
from aigcq.plumbing.cancel import cancel_and_wait
from aigcq.plumbing.redis_client import redis_client
from aigcq.storage import Storage, StorageSettings, build_storage
from aigcq.storage.local import LocalStorage

log = logging.getLogger(__name__)


@dataclass
class AsynchProcess:
    """The service's parts, built over the pools and clients it is given."""

    settings: AsynchSettings
    pool: Pool
    redis: aioredis.Redis
    http: httpx.AsyncClient
    model_http: aiohttp.ClientSession
    storage: Storage
    models: ModelRepo = field(init=False)
    types: ModelTypeRepo = field(init=False)
    tasks: TaskRepo = field(init=False)
    gate: QueueGate = field(init=False)
    semaphore: Semaphore = field(init=False)
    admission: Admission = field(init=False)
    callbacks: Callbacks = field(init=False)
    worker: Worker = field(init=False)
    cleaner: Cleaner = field(init=False)

    def __post_init__(self) -> None:
        s, pool, redis = self.settings, self.pool, self.redis
        rebuild = Rebuilder(pool, redis, s.lease_seconds).ensure
        self.semaphore = Semaphore(redis, s.lease_seconds, rebuild)
        self.gate = QueueGate(redis, rebuild)
        self.admission = Admission(redis, s.lease_seconds, rebuild)
        self.models = ModelRepo(pool, s.model_cache_seconds)
        self.types = ModelTypeRepo(pool, self.http, s.prompts_core_url)
        self.tasks = TaskRepo(pool)
        self.callbacks = Callbacks(
            pool,
            self.http,
            s.callback_attempts,
            s.callback_backoff_seconds,
            s.callback_poll_seconds,
        )
        executor = Executor(
            http=self.model_http,
            models=self.models,
            tasks=self.tasks,
            storage=self.storage,
            semaphore=self.semaphore,
            admission=self.admission,
            callbacks=self.callbacks,
            upload_attempts=s.upload_attempts,
            text_max_chars=s.result_text_max_chars,
            reply_max_bytes=s.reply_max_bytes,
        )
        self.worker = Worker(
            self.tasks,
            executor,
            self.semaphore,
            interval=s.worker_interval_seconds,
            batch_size=s.worker_batch_size,
            capacity=s.worker_goroutines * s.worker_batch_size,
        )
        self.cleaner = Cleaner(
            pool,
            self.gate,
            self.semaphore,
            running_grace=s.running_grace_seconds,
            queue_timeout=s.queue_timeout_seconds,
            gate_grace=s.gate_grace_seconds,
            files=self.local_files,
            rebuild=rebuild,
        )

    @property
    def local_files(self) -> LocalStorage | None:
        """The local folder this service serves at ``/files``, if that is the backend."""
        return self.storage if isinstance(self.storage, LocalStorage) else None

    async def cleaner_loop(self) -> None:
        while True:
            with one_round(log, "cleaner pass failed"):
                await self.cleaner.run_once()
            await asyncio.sleep(self.settings.cleaner_interval_seconds)

    async def reaper_loop(self) -> None:
        """Every half lease: requeue the running attempts whose worker died (see
        :meth:`Cleaner.reclaim`) and get them claimed."""
        while True:
            await asyncio.sleep(self.settings.lease_seconds / 2)
            try:
                for task_id in await self.cleaner.reclaim():
                    if self.settings.worker_enabled:
                        self.worker.wake()
                    else:
                        self.worker.follow(task_id)
            except Exception as exc:
                round_failed(log, "reclaiming the tasks of dead workers failed", exc)

    @contextlib.asynccontextmanager
    async def background(self) -> AsyncIterator[None]:
        """Run the worker and cleaner loops that the settings enable."""
        loops = []
        if self.settings.worker_enabled:
            loops.append(asyncio.create_task(self.worker.loop(), name="asynch-worker"))
        if self.settings.cleaner_enabled:
            loops.append(asyncio.create_task(self.cleaner_loop(), name="asynch-cleaner"))
        try:
            yield
        finally:
            await cancel_and_wait(loops)


@contextlib.asynccontextmanager
async def open_process(
    settings: AsynchSettings,
    *,
    database_url: str,
    redis_url: str,
    data_dir: Path,
    storage_settings: StorageSettings | None = None,
) -> AsyncIterator[AsynchProcess]:
    """Open pools and clients, yield the service, then stop its work and close them."""
    pool = await open_pool(database_url, settings.db_pool_max, settings.db_acquire_timeout_seconds)
    redis = redis_client(redis_url)
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    http = httpx.AsyncClient(limits=limits, timeout=30.0)
    model_http = model_session()
    storage = build_storage(
        storage_settings or StorageSettings(),
        http,
        default_dir=data_dir / "files",
        default_url=f"{settings.base_url}/files",
    )
    service = AsynchProcess(settings, pool, redis, http, model_http, storage)
    loops = [
        asyncio.create_task(service.callbacks.loop(), name="asynch-callbacks"),
        asyncio.create_task(service.reaper_loop(), name="asynch-reaper"),
    ]
    try:
        yield service
    finally:
        await cancel_and_wait(loops)
        await service.worker.aclose()
        await service.callbacks.aclose()
        await service.admission.aclose()
        await http.aclose()
        await model_http.close()
        await redis.aclose()
        await pool.close()
