"""The ``aigcq`` command line: server commands, client commands, status, emulators, demo.

The typer app is :data:`aigcq.cli.app.app`; this package imports nothing, so a module
that ``aigcq.cli.app`` registers (``aigcq.asynch.cli``) may use ``aigcq.cli.common``.
"""
