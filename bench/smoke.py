"""``--smoke``, the option every bench takes: a tiny run (a few tasks, one trial, seconds)
that only shows the bench still works — it starts what it starts, drives it and prints its
JSON. The suite runs each bench so (``tests/integration/test_benches_smoke.py``), so that no
bench rots between the runs made by hand; a smoke run's figures mean nothing.

A bench declares its smoke size as the values of its own options, which ``--smoke`` sets
(options given on the command line beside it are overridden)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from bench import host

HELP = "a tiny run that only checks the bench works (the suite runs it); figures mean nothing"


def parse_args(
    parser: argparse.ArgumentParser, tiny: dict[str, Any], argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """``parser``'s arguments, with ``--smoke`` added: when given, ``tiny`` (option dest ->
    value) replaces the sizes."""
    parser.add_argument("--smoke", action="store_true", help=HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        unknown = set(tiny) - set(vars(args))
        assert not unknown, f"no such options: {sorted(unknown)}"
        vars(args).update(tiny)
        host.LOOP = 10**5  # the yardstick too
    return args
