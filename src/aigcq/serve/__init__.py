"""The serve process: its assembly (server), launch, worker processes, shutdown, metrics."""
