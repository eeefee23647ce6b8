"""A private PostgreSQL server for ``aigcq asynch`` and the tests.

Uses ``initdb``/``postgres`` from PATH, else from ``/usr/lib/postgresql/*/bin``, else the
binaries bundled by the ``pgserver`` wheel. The cluster lives under ``data_dir/pgdata`` and
listens only on a Unix socket in ``data_dir`` (no TCP port), with trust authentication for the
``postgres`` role. PostgreSQL refuses to run as root, so when we are root the data directory is
handed to the ``postgres`` system user (else ``nobody``) and the server runs as that user; the
data directory's parents must then be traversable by it (``/tmp`` or the working tree are).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import IO
from urllib.parse import quote

import psycopg

from aigcq.embedded.ownership import EmbeddedServerError, PrivateServer, stop_leftover

log = logging.getLogger(__name__)

PORT = 5432  # only names the socket file: the server listens on no TCP port


class EmbeddedPostgresError(EmbeddedServerError):
    pass


def find_bin_dir() -> Path:
    """The directory holding ``initdb`` and ``postgres``."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("postgres"):
        return Path(os.path.realpath(on_path)).parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(candidate) / "postgres").exists():
            return Path(candidate)
    try:
        import pgserver
    except ImportError as exc:
        raise EmbeddedPostgresError(
            "no PostgreSQL binaries found (PATH, /usr/lib/postgresql/*/bin) and the pgserver "
            "wheel is not installed; install PostgreSQL, `pip install aigcq[embedded]`, "
            "or set AIGCQ_DATABASE_URL"
        ) from exc
    return Path(pgserver.__file__).parent / "pginstall" / "bin"


def _service_user() -> pwd.struct_passwd | None:
    """The unprivileged user to run as, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise EmbeddedPostgresError("running as root and neither 'postgres' nor 'nobody' exists")


def _check_traversable(path: Path, user: pwd.struct_passwd) -> None:
    for parent in path.parents:
        st = parent.stat()
        if st.st_uid != user.pw_uid and not st.st_mode & 0o001:
            raise EmbeddedPostgresError(
                f"{path}: parent {parent} is not traversable by user {user.pw_name!r}, "
                "which PostgreSQL must run as when started by root; choose another data dir"
            )


class EmbeddedPostgres(PrivateServer):
    """Create (once), start, stop and kill a private PostgreSQL cluster.

    ``fast=True`` turns durability off (fsync, synchronous commit, full-page writes): for tests
    and benchmarks only.
    """

    start_timeout = 30.0

    def __init__(self, data_dir: Path, *, fast: bool = False) -> None:
        super().__init__(data_dir)
        self.pgdata = self.data_dir / "pgdata"
        self.fast = fast
        self._user = _service_user()

    @property
    def url(self) -> str:
        return f"postgresql://postgres@/postgres?host={quote(str(self.data_dir))}&port={PORT}"

    def _start(self, timeout: float) -> str:
        self._prepare_dir()
        stop_leftover(self.pgdata / "postmaster.pid", "postgres", signal.SIGINT)
        bin_dir = find_bin_dir()
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb(bin_dir)
        args = [
            str(bin_dir / "postgres"),
            "-D", str(self.pgdata),
            "-k", str(self.data_dir),
            "-p", str(PORT),
            "-c", "listen_addresses=",
            "-c", "max_connections=200",
        ]  # fmt: skip
        if self.fast:
            args += ["-c", "fsync=off", "-c", "synchronous_commit=off"]
            args += ["-c", "full_page_writes=off"]
        log_file = (self.data_dir / "postgres.log").open("ab")
        self._proc = self._spawn(args, stdout=log_file)
        log_file.close()
        self._wait_ready(timeout)
        log.info("embedded postgres started at %s (pid %s)", self.data_dir, self._proc.pid)
        return self.url

    def stop(self, timeout: float = 15.0) -> None:
        """Fast shutdown (SIGINT), escalating to SIGKILL."""
        if self._proc is None:
            return
        self._proc.send_signal(signal.SIGINT)
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._stopped()

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends (its process group)."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        self._stopped()

    def _prepare_dir(self) -> None:
        if self._user is None:
            return
        _check_traversable(self.data_dir, self._user)
        for path in (self.data_dir, *self.data_dir.rglob("*")):
            os.chown(path, self._user.pw_uid, self._user.pw_gid, follow_symlinks=False)

    def _initdb(self, bin_dir: Path) -> None:
        args = [str(bin_dir / "initdb"), "-D", str(self.pgdata), "-U", "postgres"]
        args += ["-A", "trust", "-E", "UTF8", "--no-locale"]
        if self.fast:
            args.append("--no-sync")
        proc = self._spawn(args, stdout=subprocess.PIPE)
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise EmbeddedPostgresError(f"initdb failed: {out.decode(errors='replace')}")

    def _spawn(self, args: list[str], stdout: int | IO[bytes]) -> subprocess.Popen[bytes]:
        """Start a PostgreSQL program in its own session, as the service user when root."""
        env = {**os.environ, "LC_ALL": "C"}
        user = self._user
        if user is not None:
            env.update(HOME=user.pw_dir, USER=user.pw_name)
        return subprocess.Popen(
            args,
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(self.data_dir),
            user=None if user is None else user.pw_uid,
            group=None if user is None else user.pw_gid,
            extra_groups=None if user is None else [],
        )

    def _wait_ready(self, timeout: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while not self._accepting():
            if self._proc.poll() is not None:
                tail = (self.data_dir / "postgres.log").read_text(errors="replace")[-2000:]
                self._proc = None
                raise EmbeddedPostgresError(f"postgres exited: {tail.strip()}")
            if time.monotonic() > deadline:
                self.kill()
                raise EmbeddedPostgresError("postgres did not accept connections in time")
            time.sleep(0.05)

    def _accepting(self) -> bool:
        """Our postmaster (the one its lock file names) accepts connections."""
        assert self._proc is not None
        try:
            owner = (self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0].strip()
            psycopg.connect(self.url, connect_timeout=2).close()
        except (OSError, psycopg.OperationalError):
            return False
        return owner == str(self._proc.pid)
