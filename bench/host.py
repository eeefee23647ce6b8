"""What a bench reads off its host: a process's CPU time, and how fast the host runs Python now.

The benches share the machine with their own servers and, on a VM, with its neighbours: a
busy host moved the same code's figures by 2x within one session. Each bench therefore
prints ``host_python_ms`` beside its figures, taken before and after the run: the time of a
fixed pure-Python loop (about 265 ms on a quiet 2-core VM of the kind in the README). Compare
figures only between runs whose yardsticks agree.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: the yardstick's loop (``bench.smoke`` shrinks it: a smoke run's figures mean nothing)
LOOP = 10**7


def python_speed_ms() -> float:
    """Milliseconds the host takes for ``sum(range(10**7))``, best of three."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        sum(range(LOOP))
        best = min(best, time.perf_counter() - start)
    return round(best * 1000, 1)


def rss_kib(pid: int) -> int:
    """The process's resident set (``VmRSS``), in KiB; 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0
