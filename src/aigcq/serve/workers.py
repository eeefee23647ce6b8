"""``AIGCQ_WORKERS=N``: N server processes on the same ports, one per core.

The processes of one deployment already share every piece of state through Redis
(claims are atomic, a result reaches its client through the client's outbox whichever
process finished the task), so using more cores of one machine only needs the listening
ports shared: each worker binds them with SO_REUSEPORT and the kernel spreads new
connections across workers. This supervisor starts the workers, restarts one that dies,
and on SIGINT / SIGTERM stops them all gracefully (each hands its work back).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

from aigcq.config import Settings
from aigcq.plumbing.ports import local_host

log = logging.getLogger(__name__)

#: a worker that exits with an error this soon after starting failed at start-up (bad
#: configuration, port taken): stop rather than loop; one killed by a signal is restarted
STARTUP_S = 5.0
STOP_TIMEOUT_S = 30.0


class Worker:
    def __init__(self, index: int, env: dict[str, str]) -> None:
        self.index, self.env = index, env
        self.started = time.monotonic()
        # Its own session: a Ctrl-C in the terminal reaches only the supervisor, which
        # then sends each worker one SIGTERM (a second signal would skip the hand-back).
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aigcq", "serve"], env=env, start_new_session=True
        )
        log.info("worker %d started (pid %d)", index, self.proc.pid)

    def failed_at_start(self, code: int) -> bool:
        return code > 0 and time.monotonic() - self.started < STARTUP_S


def answers(settings: Settings) -> bool:
    """Whether a worker answers ``/healthz`` on the client port."""
    url = f"http://{local_host(settings.host)}:{settings.ws_port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=0.5) as answer:
            return bool(answer.status == 200)
    except OSError:  # refused, timed out, or an HTTP error status (URLError, HTTPError)
        return False


def worker_env(settings: Settings) -> dict[str, str]:
    """The supervisor's environment plus what it settled: Redis, generated secrets."""
    return {
        **os.environ,
        "AIGCQ_REDIS_URL": settings.redis_url,
        "AIGCQ_TOKEN_SECRET": settings.token_secret,
        "AIGCQ_ADMIN_TOKEN": settings.admin_token,
        "AIGCQ_BRIDGE_TOKEN": settings.bridge_token,
        "AIGCQ_WORKERS": "1",
        "AIGCQ_REUSE_PORT": "true",
    }


def supervise(settings: Settings, on_listening: Callable[[], None] | None = None) -> bool:
    """Run ``settings.workers`` workers until SIGINT / SIGTERM (raised as exceptions);
    False when a worker failed at start-up (all are stopped then). ``on_listening``:
    called once a worker answers on the ports."""
    env = worker_env(settings)
    workers = [Worker(i, env) for i in range(settings.workers)]
    try:
        while True:
            time.sleep(0.5)
            if on_listening is not None and answers(settings):
                on_listening()
                on_listening = None
            for i, worker in enumerate(workers):
                code = worker.proc.poll()
                if code is None:
                    continue
                if worker.failed_at_start(code):
                    log.error("worker %d exited at start-up (code %s); stopping", i, code)
                    return False
                pid = worker.proc.pid
                log.warning("worker %d (pid %d) exited with %s; restarting", i, pid, code)
                workers[i] = Worker(i, env)
    finally:
        _stop(workers)


def _stop(workers: list[Worker]) -> None:
    for worker in workers:
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for worker in workers:
        try:
            worker.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("worker %d did not stop in time; killing it", worker.index)
            worker.proc.kill()
            worker.proc.wait()
