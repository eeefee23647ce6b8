"""PostgreSQL and Redis for ``aigcq asynch``: the configured URLs, else private servers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from aigcq.embedded.postgres import EmbeddedPostgres
from aigcq.embedded.redis import EmbeddedRedis


@contextlib.contextmanager
def backing_services(
    database_url: str, redis_url: str, data_dir: Path
) -> Iterator[tuple[str, str]]:
    """Yield ``(database_url, redis_url)``, starting a private server for each one not set
    (data under ``data_dir/postgres`` and ``data_dir/redis``) and stopping it afterwards."""
    with contextlib.ExitStack() as stack:
        if not database_url:
            pg = EmbeddedPostgres(data_dir / "postgres")
            database_url = pg.start()
            stack.callback(pg.stop)
        if not redis_url:
            rd = EmbeddedRedis(data_dir / "redis")
            redis_url = rd.start()
            stack.callback(rd.stop)
        yield database_url, redis_url
