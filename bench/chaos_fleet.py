"""The chaos run's fleet part: the same load, processes and figures as ``bench/chaos.py``,
and only our own GPUs are struck: ``aigcq bridge`` processes SIGKILLed at random and
restarted (same port and data dir, so the same bridge id, re-registering with the prompts
it held; see ``bench/fleet.py``). Tasks still overflow to the recording RunningHub
emulator when the bridges are full or gone. Prints JSON, the figures that must be 0
included (lost, duplicated_to_client, double_paid, paid_but_failed, peak_over_cap,
leaked_slots, with every bridge slot free as the hub and the bridge itself see it).

    python bench/chaos_fleet.py [--seconds 20] [--rate 10] [--seed 1]
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.chaos import main, parse

if __name__ == "__main__":
    args = parse(faults=("kill_bridge",), doc=__doc__)
    print(json.dumps(asyncio.run(main(args)), indent=2))
