"""A scale hook (``AIGCQ_SCALE_COMMAND``) that rents local instances, for the e2e test of the
capacity planner: ``python scale_hook.py DIR POOL DESIRED [BRIDGE_ID...]``.

An instance of a pool is an ``aigcq emulate comfyui`` and an ``aigcq bridge`` in front of
it, started detached, the bridge named ``<pool>-<n>`` (its ``bridge_id`` file written
before it starts, as docs/capacity.md tells a deployment to). The named bridges are
stopped (SIGTERM), then the pool is brought up to DESIRED. ``DIR/hook.json`` gives the
server's bridge URL, the bridge token, the emulator's arguments and the ports reserved for
the instances; ``DIR/instances.json`` keeps what runs; ``DIR/hook.log`` each call."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _start(args: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aigcq", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this hook
            env={**os.environ, **(env or {})},
        )
    return proc.pid


def _instance(home: Path, conf: dict[str, Any], bridge_id: str, ports: list[int]) -> list[int]:
    comfy_port, bridge_port = ports
    data = home / bridge_id
    data.mkdir(exist_ok=True)
    (data / "bridge_id").write_text(bridge_id + "\n")
    comfy = _start(
        ["emulate", "comfyui", "--port", str(comfy_port), "--output-dir", str(data / "out"),
         *conf["comfyui_args"]],
        data / "comfyui.log",
    )  # fmt: skip
    bridge = _start(
        ["bridge", f"--server={conf['server']}", f"--comfyui=http://127.0.0.1:{comfy_port}",
         f"--port={bridge_port}", f"--data-dir={data}", "--heartbeat=0.5"],
        data / "bridge.log",
        {"AIGCQ_BRIDGE_TOKEN": conf["token"]},
    )  # fmt: skip
    return [bridge, comfy]


def main(argv: list[str]) -> None:
    home, pool, desired, stop = Path(argv[1]), argv[2], int(argv[3]), argv[4:]
    conf = json.loads((home / "hook.json").read_text())
    state_file = home / "instances.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {"n": 0, "up": {}}
    with (home / "hook.log").open("a") as log:
        log.write(json.dumps({"at": time.time(), "pool": pool, "desired": desired, "stop": stop}))
        log.write("\n")
    for bridge_id in stop:
        for pid in state["up"].pop(bridge_id, {}).get("pids", []):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    mine = [b for b in state["up"] if b.startswith(f"{pool}-")]
    for _ in range(desired - len(mine)):
        n = state["n"]
        state["n"] = n + 1
        bridge_id = f"{pool}-{n}"
        ports = conf["ports"][2 * n : 2 * n + 2]
        state["up"][bridge_id] = {
            "pids": _instance(home, conf, bridge_id, ports),
            "at": time.time(),
        }
    state_file.write_text(json.dumps(state))


if __name__ == "__main__":
    main(sys.argv)
