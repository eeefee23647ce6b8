"""The emulator's settings."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


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

    def directory(self, kind: str) -> Path | None:
        """The folder for a ``/view`` ``type`` (output, input, temp)."""
        base = self.output_dir.parent
        dirs = {
            "output": self.output_dir,
            "input": self.input_dir or base / "input",
            "temp": self.temp_dir or base / "temp",
        }
        return dirs.get(kind)
