"""Checks on an ``aigcq`` command run with typer's CliRunner."""

from __future__ import annotations

from click.testing import Result


def one_error_line(result: Result, exit_code: int) -> str:
    """The single ``error: ...`` line on stderr, after checking nothing else happened."""
    assert result.exit_code == exit_code, result.output
    assert isinstance(result.exception, SystemExit), result.exc_info  # not an uncaught error
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]
