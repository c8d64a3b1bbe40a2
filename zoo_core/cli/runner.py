"""The one runner every zoo command line goes through: parse, set up logging, run, map errors to exit codes.

``zoo`` (``zoo.py``), ``python -m zoo_core.cli.hub`` and ``python -m zoo_core.train`` all call ``run``, so a
``ZooError`` prints the same one-line message with the same exit code whichever door the user came in by.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from ..errors import ZooError


def add_memory_flags(s: argparse.ArgumentParser) -> None:
    """--memory-budget / --no-memory-check (zoo build, zoo train): the size check before allocating."""
    s.add_argument("--memory-budget", metavar="SIZE",
                   help="refuse models that need more than SIZE (e.g. 32GiB; default: $ZOO_MEMORY_BUDGET, else the "
                        "memory available now)")
    s.add_argument("--no-memory-check", dest="memory_check", action="store_false",
                   help="build even when the estimate exceeds the budget")


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command with the zoo's logging, messages and exit codes.

    ``parser`` needs a ``-v/--verbose`` flag and subcommands that set ``fn`` and ``command``
    (``zoo`` itself, and the ``python -m zoo_core.train`` / ``python -m zoo_core.cli.hub`` entry points).
    """
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if not getattr(args, "fn", None):
        parser.print_help()
        return 2
    try:
        return int(args.fn(args) or 0)
    except ZooError as exc:
        if args.verbose:
            raise
        print(f"zoo {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return 0
