"""``python -m aigcq.asynch`` = ``aigcq asynch``."""

from aigcq.cli.asynch import asynch_app

asynch_app(prog_name="aigcq asynch")
