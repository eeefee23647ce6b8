"""The private PostgreSQL and Redis of ``aigcq asynch``: stopped on SIGTERM, and a restart after
SIGKILL first stops the ones the killed process left behind, keeping their data."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from aigcq.embedded.ownership import DirectoryInUse, stop_leftover
from aigcq.embedded.redis import EmbeddedRedis
from tests.fakes.processes import ASYNCH_ADMIN_TOKEN, reserved_port, wait_healthy

ADMIN = {"Authorization": f"Bearer {ASYNCH_ADMIN_TOKEN}"}

pytestmark = pytest.mark.e2e


_STARTED: list[subprocess.Popen[bytes]] = []


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data dir under /tmp (when tests run as root, PostgreSQL runs as another user that
    must reach it). Afterwards, whatever a failed test left running there is stopped."""
    path = Path(tempfile.mkdtemp(prefix="aigcq-test-private-"))
    path.chmod(0o755)
    yield path
    while _STARTED:
        proc = _STARTED.pop()
        proc.kill()
        proc.wait()
    stop_leftover(path / "postgres" / "pgdata" / "postmaster.pid", "postgres", signal.SIGINT)
    stop_leftover(path / "asynch-redis" / "redis.pid", "redis-server", signal.SIGTERM)
    shutil.rmtree(path, ignore_errors=True)


def _env(data_dir: Path, port: int) -> dict[str, str]:
    """No database or Redis URL: the process starts private servers under ``data_dir``."""
    unset = ("AIGCQ_DATABASE_URL", "AIGCQ_REDIS_URL")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    return {
        **env,
        "AIGCQ_DATA_DIR": str(data_dir),
        "AIGCQ_ASYNCH_PORT": str(port),
        "AIGCQ_ASYNCH_ADMIN_TOKEN": ASYNCH_ADMIN_TOKEN,
    }


def _start(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    env = _env(data_dir, port)
    log = (data_dir / "asynch.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "aigcq.asynch"], env=env, stdout=log, stderr=log)
    _STARTED.append(proc)
    log.close()
    wait_healthy(proc, f"http://127.0.0.1:{port}", data_dir / "asynch.log", timeout=60)
    return proc


def _server_pids(data_dir: Path) -> list[int]:
    postmaster = data_dir / "postgres" / "pgdata" / "postmaster.pid"
    redis = data_dir / "asynch-redis" / "redis.pid"
    return [int(f.read_text().split("\n", 1)[0]) for f in (postmaster, redis)]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_sigterm_stops_the_private_servers(data_dir: Path) -> None:
    proc = _start(data_dir, reserved_port())
    pids = _server_pids(data_dir)
    assert all(_alive(pid) for pid in pids)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert not any(_alive(pid) for pid in pids), (data_dir / "asynch.log").read_text()[-2000:]


def test_a_restart_after_sigkill_stops_the_servers_left_behind(data_dir: Path) -> None:
    port = reserved_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(data_dir, port)
    model = {"modelName": "kept", "baseUrl": "http://127.0.0.1:9"}
    assert httpx.post(f"{url}/model/createModel", json=model, headers=ADMIN).status_code == 200
    leftovers = _server_pids(data_dir)
    proc.kill()
    proc.wait()
    assert all(_alive(pid) for pid in leftovers)  # their own session: SIGKILL spares them

    proc = _start(data_dir, port)
    try:
        assert not any(_alive(pid) for pid in leftovers)
        new = _server_pids(data_dir)
        assert set(new).isdisjoint(leftovers) and all(_alive(pid) for pid in new)
        got = httpx.get(f"{url}/model/getModel", params={"modelName": "kept"}, headers=ADMIN)
        assert got.json()["data"]["modelName"] == "kept"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


_OWNER = """
import sys, time
from pathlib import Path
from aigcq.embedded.redis import EmbeddedRedis
print(EmbeddedRedis(Path(sys.argv[1]), persist=True).start(), flush=True)
time.sleep(600)  # the owner lives on (until killed): the subject
"""


def test_a_leftover_redis_is_stopped_cleanly_and_its_data_kept(data_dir: Path) -> None:
    import redis

    tmp_path = data_dir / "asynch-redis"  # where the fixture looks for leftovers
    tmp_path.mkdir()
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(tmp_path)], stdout=subprocess.PIPE)
    _STARTED.append(owner)
    assert owner.stdout is not None
    client = redis.Redis.from_url(owner.stdout.readline().decode().strip())
    client.set("k", "v")
    client.close()
    leftover = int((tmp_path / "redis.pid").read_text())

    with pytest.raises(DirectoryInUse, match=f"pid {owner.pid}"):  # its owner lives
        EmbeddedRedis(tmp_path, persist=True).start()
    assert _alive(leftover)

    owner.kill()  # its Redis lives on, in its own session
    owner.wait()
    second = EmbeddedRedis(tmp_path, persist=True)
    try:
        client = redis.Redis.from_url(second.start())
        assert not _alive(leftover)
        assert client.get("k") == b"v"  # SIGTERM made the leftover flush its append-only file
        client.close()
    finally:
        second.stop()


def test_a_second_process_on_a_data_dir_in_use_exits_and_harms_nothing(data_dir: Path) -> None:
    port = reserved_port()
    first = _start(data_dir, port)
    try:
        pids = _server_pids(data_dir)
        env = _env(data_dir, reserved_port())
        second = subprocess.run(
            [sys.executable, "-m", "aigcq.asynch"], env=env, capture_output=True, timeout=60
        )
        assert second.returncode == 1
        assert f"in use by another aigcq process (pid {first.pid})" in second.stderr.decode()
        assert "Traceback" not in second.stderr.decode()
        assert all(_alive(pid) for pid in pids)
        listed = httpx.get(f"http://127.0.0.1:{port}/model/listModel", headers=ADMIN)
        assert listed.status_code == 200
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(30)


def test_a_pid_file_naming_another_program_stops_nothing(tmp_path: Path) -> None:
    other = subprocess.Popen(["sleep", "60"])  # a reused pid: now some other program
    try:
        (tmp_path / "redis.pid").write_text(f"{other.pid}\n")
        stop_leftover(tmp_path / "redis.pid", "redis-server", signal.SIGTERM)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
    (tmp_path / "junk.pid").write_text("not a pid")
    stop_leftover(tmp_path / "junk.pid", "redis-server", signal.SIGTERM)
    stop_leftover(tmp_path / "missing.pid", "redis-server", signal.SIGTERM)
