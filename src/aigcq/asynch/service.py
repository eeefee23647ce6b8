"""The asynch service's parts, wired together and opened/closed as one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
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
from aigcq.plumbing.background import cancel_and_wait, round_failed
from aigcq.plumbing.redis_client import redis_client
from aigcq.storage import Storage, StorageSettings, build_storage
from aigcq.storage.local import LocalStorage

log = logging.getLogger(__name__)


@dataclass
class AsynchService:
    settings: AsynchSettings
    pool: Pool
    redis: aioredis.Redis
    http: httpx.AsyncClient
    model_http: aiohttp.ClientSession
    storage: Storage
    models: ModelRepo
    types: ModelTypeRepo
    tasks: TaskRepo
    gate: QueueGate
    semaphore: Semaphore
    admission: Admission
    callbacks: Callbacks
    worker: Worker
    cleaner: Cleaner

    @property
    def public_url(self) -> str:
        s = self.settings
        return (s.public_url or f"http://{s.host}:{s.port}").rstrip("/")

    @property
    def local_files(self) -> LocalStorage | None:
        """The local folder this service serves at ``/files``, if that is the backend."""
        return self.storage if isinstance(self.storage, LocalStorage) else None

    async def cleaner_loop(self) -> None:
        while True:
            try:
                await self.cleaner.run_once()
            except Exception as exc:
                round_failed(log, "cleaner pass failed", exc)
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
async def open_service(
    settings: AsynchSettings,
    *,
    database_url: str,
    redis_url: str,
    data_dir: Path,
    storage_settings: StorageSettings | None = None,
) -> AsyncIterator[AsynchService]:
    """Open pools and clients, yield the service, then stop its work and close them."""
    pool = await open_pool(database_url, settings.db_pool_max, settings.db_acquire_timeout_seconds)
    redis = redis_client(redis_url)
    rebuild = Rebuilder(pool, redis, settings.lease_seconds).ensure
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    http = httpx.AsyncClient(limits=limits, timeout=30.0)
    model_http = model_session()
    public = (settings.public_url or f"http://{settings.host}:{settings.port}").rstrip("/")
    storage = build_storage(
        storage_settings or StorageSettings(),
        http,
        default_dir=data_dir / "files",
        default_url=f"{public}/files",
    )
    semaphore = Semaphore(redis, settings.lease_seconds, rebuild)
    gate = QueueGate(redis, rebuild)
    admission = Admission(redis, settings.lease_seconds, rebuild)
    models = ModelRepo(pool, settings.model_cache_seconds)
    tasks = TaskRepo(pool)
    callbacks = Callbacks(
        pool,
        http,
        settings.callback_attempts,
        settings.callback_backoff_seconds,
        settings.callback_poll_seconds,
    )
    executor = Executor(
        http=model_http,
        models=models,
        tasks=tasks,
        storage=storage,
        gate=gate,
        semaphore=semaphore,
        admission=admission,
        callbacks=callbacks,
        upload_attempts=settings.upload_attempts,
        text_max_chars=settings.result_text_max_chars,
        reply_max_bytes=settings.reply_max_bytes,
    )
    worker = Worker(
        tasks,
        executor,
        semaphore,
        interval=settings.worker_interval_seconds,
        batch_size=settings.worker_batch_size,
        capacity=settings.worker_goroutines * settings.worker_batch_size,
    )
    cleaner = Cleaner(
        pool,
        gate,
        semaphore,
        running_grace=settings.running_grace_seconds,
        queue_timeout=settings.queue_timeout_seconds,
        gate_grace=settings.gate_grace_seconds,
        files=storage if isinstance(storage, LocalStorage) else None,
        rebuild=rebuild,
    )
    service = AsynchService(
        settings=settings,
        pool=pool,
        redis=redis,
        http=http,
        model_http=model_http,
        storage=storage,
        models=models,
        types=ModelTypeRepo(pool, http, settings.prompts_core_url),
        tasks=tasks,
        gate=gate,
        semaphore=semaphore,
        admission=admission,
        callbacks=callbacks,
        worker=worker,
        cleaner=cleaner,
    )
    loops = [
        asyncio.create_task(callbacks.loop(), name="asynch-callbacks"),
        asyncio.create_task(service.reaper_loop(), name="asynch-reaper"),
    ]
    try:
        yield service
    finally:
        await cancel_and_wait(loops)
        await worker.aclose()
        await callbacks.aclose()
        await admission.aclose()
        await http.aclose()
        await model_http.close()
        await redis.aclose()
        await pool.close()
