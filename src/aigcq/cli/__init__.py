"""The ``aigcq`` command line: server commands, client commands, status, emulators, demo.

The typer app is :data:`aigcq.cli.app.app`; this package imports nothing, so
``python -m aigcq.asynch`` loads only the ``asynch`` command (:mod:`aigcq.asynch.cli`).
"""
