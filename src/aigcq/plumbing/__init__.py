"""Plumbing shared by every process: Redis connections, the event bus, background loops, frames."""
