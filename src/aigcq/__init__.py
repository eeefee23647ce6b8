"""aigcq: a task queue backend for AI-generation work (internal GPUs first, paid overflow)."""

__version__ = "0.1.0"
