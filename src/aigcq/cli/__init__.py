"""The ``aigcq`` command line: server commands, client commands, status, emulators, demo."""

from aigcq.cli.app import app, main

__all__ = ["app", "main"]
