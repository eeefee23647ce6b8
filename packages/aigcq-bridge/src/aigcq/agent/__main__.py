"""``python -m aigcq.agent`` = ``aigcq-bridge`` = ``aigcq bridge``."""

from aigcq.agent.cli import main

main()
