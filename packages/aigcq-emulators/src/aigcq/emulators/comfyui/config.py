"""The emulator's settings."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class GpuTime:
    """Which checkpoint is in VRAM, and seconds spent loading models and running prompts;
    ``spans``: when each of the last prompts ran (wall-clock start and end, seconds), for a
    bench that asks when this GPU sat idle."""

    loaded: str | None = None
    loading_s: float = 0.0
    busy_s: float = 0.0
    loads: int = 0
    spans: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=100_000))
    running_since: float | None = None


@dataclass
class ComfyUIConfig:
    """Emulator settings; ``fail_next`` and ``fail_rate`` may be changed while running."""

    output_dir: Path = Path(".aigcq/comfyui/output")
    input_dir: Path | None = None  # default: ``output_dir/../input``
    temp_dir: Path | None = None  # default: ``output_dir/../temp``
    step_time: float = 0.05
    steps: int = 4
    fail_rate: float = 0.0
    fail_next: int = 0
    seed: int | None = None
    #: the node classes this instance has (``None``: every emulated one), as in
    #: ``/object_info``; a prompt naming another is ``invalid_prompt``
    node_classes: frozenset[str] | None = None
    #: model files offered by ``CheckpointLoaderSimple.ckpt_name``
    checkpoints: tuple[str, ...] = ("sd15.safetensors",)
    #: seconds to load a checkpoint that is not the one in VRAM
    model_load_time: float = 0.0
    #: seconds a running prompt goes on after ``POST /interrupt`` (real ComfyUI stops at
    #: the sampler's next step check, about a second on a GPU); 0: at the next step
    interrupt_latency: float = 0.0
    #: ``POST /interrupt`` stops whatever runs, its ``prompt_id`` ignored, as ComfyUI did
    #: before 0.3.56 (a prompt of someone else's, when the one named only waits)
    global_interrupt: bool = False
    #: a socket of a ``clientId`` that has one replaces it without closing it, and any
    #: socket of it closing forgets the ``clientId``, as in ComfyUI's ``server.py``: an
    #: older socket closing after a newer one connected leaves that one hearing nothing
    forget_client_on_close: bool = False
    #: seconds ``GET /view`` takes before it sends the file (a large output over a slow
    #: link: the GPU is free meanwhile)
    view_latency: float = 0.0
    #: seconds ``GET /history/{prompt_id}`` takes (a loaded ComfyUI with a long history:
    #: the prompt has ended, the GPU is free meanwhile)
    history_latency: float = 0.0
    #: the torch device ``/system_stats`` names, and its VRAM in bytes (0: a CPU device)
    device: str = "cpu"
    vram_total: int = 0
    vram_free: int = 0
    #: GPU time accounting (see :class:`GpuTime`)
    gpu: GpuTime = field(default_factory=lambda: GpuTime())

    def directory(self, kind: str) -> Path | None:
        """The folder for a ``/view`` ``type`` (output, input, temp)."""
        base = self.output_dir.parent
        dirs = {
            "output": self.output_dir,
            "input": self.input_dir or base / "input",
            "temp": self.temp_dir or base / "temp",
        }
        return dirs.get(kind)
