"""How fast ``aigcq`` starts: ``--help``, and client commands that reach the network at once.

Each command runs as its own ``python -m aigcq`` process, ``--runs`` times; the wall time from
spawn to exit is reported (best and median, milliseconds), and the process's CPU time (user +
system), which a busy host disturbs much less than the wall time. The client commands are
pointed at
a port that refuses connections, so their run is the start, one refused connection and the
one-line error: what an operator waits for before the server is even asked. ``import_ms`` is
the import time of everything the command imports (``top_imports_ms``: its largest
top-level imports) and ``heavy`` the server-side libraries that ``--help`` and a client
command load (none is the goal), all read with ``-X importtime``; ``python_ms`` is the
bare interpreter's start (``python -c pass``), which no command can beat.

    python bench/cli_start_bench.py [--runs 10]

Prints one JSON object; ``host_python_ms`` (bench/host.py) says how busy the host was.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from bench.host import python_speed_ms

#: libraries only a server needs; a client command loading one pays its import time
HEAVY = ("fastapi", "starlette", "uvicorn", "redis", "pydantic_settings", "aigcq.serve")


def commands(port: int) -> dict[str, list[str]]:
    server = ["--server", f"127.0.0.1:{port}", "--token", "t"]
    return {
        "help": ["--help"],
        "status_help": ["status", "--help"],
        "tasks_show": ["tasks", "show", "t1", *server],
        "tasks_list": ["tasks", "list", *server],
        "status": ["status", *server],
        "status_default_server": ["status", "--token", "t"],  # reads settings and .env
    }


def run_ms(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU milliseconds of one ``python -m aigcq ARGS``."""
    return run_ms_of([sys.executable, "-m", "aigcq", *args], env)


def run_ms_of(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU milliseconds of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall * 1000, cpu * 1000


def imports(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Import time of the command (every module imported once ``runpy`` started it, the
    lazily imported ones included), its largest top-level imports, and which heavy
    libraries were loaded."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "aigcq", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    started, top, loaded = False, Counter[str](), set()
    for line in run.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        module = name.strip()
        started = started or module == "runpy"
        if started and module != "runpy" and not name[1:2].isspace():
            top[module] += int(cumulative)  # imported by nothing else: the command's own
        loaded |= {h for h in HEAVY if module == h or module.startswith(h + ".")}
    return {
        "import_ms": round(sum(top.values()) / 1000, 1),
        "top_imports_ms": {m: round(us / 1000, 1) for m, us in top.most_common(5)},
        "heavy": sorted(loaded),
    }


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"runs": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=10)
    opts = smoke.parse_args(parser, SMOKE)
    with socket.socket() as refusing:  # bound, never listening: connections are refused
        refusing.bind(("127.0.0.1", 0))
        port = refusing.getsockname()[1]
        env = {**os.environ, "AIGCQ_WS_PORT": str(port), "COLUMNS": "100"}
        env.pop("AIGCQ_CLIENT_TOKEN", None)
        report: dict[str, Any] = {"host_python_ms_before": python_speed_ms(), "commands": {}}
        bare = [run_ms_of([sys.executable, "-c", "pass"], env)[0] for _ in range(opts.runs)]
        report["python_ms"] = round(min(bare), 1)
        for name, args in commands(port).items():
            walls, cpus = zip(*(run_ms(args, env) for _ in range(opts.runs)), strict=True)
            report["commands"][name] = {
                "best_ms": round(min(walls), 1),
                "median_ms": round(statistics.median(walls), 1),
                "cpu_best_ms": round(min(cpus), 1),
                "cpu_median_ms": round(statistics.median(cpus), 1),
                **imports(args, env),
            }
        report["host_python_ms_after"] = python_speed_ms()
        report["runs"] = opts.runs
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
