"""``python -m aigcq.asynch`` = ``aigcq asynch``."""

from aigcq.asynch.cli import asynch_app

asynch_app(prog_name="aigcq asynch")
