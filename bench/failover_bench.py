"""The Sentinel failover run of tests/fakes/failover.py, with AIGCQ_REDIS_MIN_REPLICAS 1 and
0: what a client saw acknowledged and then lost, what was paid twice, results delivered
twice, and the seconds until dispatch resumed after the master's SIGKILL. Prints JSON.

    python bench/failover_bench.py [--runs 1] [--rate 10] [--seconds 8] [--min-replicas 1,0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import smoke
from tests.fakes.failover import failover_run


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    reports = []
    for _ in range(args.runs):
        for min_replicas in (int(m) for m in args.min_replicas.split(",")):
            tmp = Path(tempfile.mkdtemp(prefix="aigcq-failover-"))
            report = await failover_run(
                tmp, min_replicas=min_replicas, rate=args.rate, seconds=args.seconds
            )
            print(json.dumps(report), file=sys.stderr)
            reports.append(report)
    return reports


#: ``--smoke`` (:mod:`bench.smoke`): the sizes of a run that only checks this bench works
SMOKE = {"runs": 1, "seconds": 2.0, "rate": 5.0, "min_replicas": "1"}

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--min-replicas", default="1,0", help="AIGCQ_REDIS_MIN_REPLICAS to run")
    print(json.dumps(asyncio.run(main(smoke.parse_args(parser, SMOKE))), indent=2))
