"""PostgreSQL and Redis for ``aigcq asynch``: the configured URLs, else private servers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from aigcq.embedded.postgres import EmbeddedPostgres
from aigcq.embedded.redis import EmbeddedRedis
from aigcq.serve.launch import start_private


@contextlib.contextmanager
def backing_services(
    database_url: str, redis_url: str, data_dir: Path
) -> Iterator[tuple[str, str]]:
    """Yield ``(database_url, redis_url)``, starting a private server for each one not set
    (data under ``data_dir/postgres`` and ``data_dir/asynch-redis``, apart from ``aigcq up``'s
    ``data_dir/redis``) and stopping it afterwards. A server that cannot start ends the
    process with a one-line reason (exit 1)."""
    with contextlib.ExitStack() as stack:
        if not database_url:
            pg = EmbeddedPostgres(data_dir / "postgres")
            database_url = start_private(pg.start)
            stack.callback(pg.stop)
        if not redis_url:
            rd = EmbeddedRedis(data_dir / "asynch-redis")
            redis_url = start_private(rd.start)
            stack.callback(rd.stop)
        yield database_url, redis_url
