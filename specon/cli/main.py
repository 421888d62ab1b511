"""``specon`` entry point: one sub-command per module in ``specon.cli``.

Each command module defines ``register(subparsers)``, which adds its parser and sets
``func`` (taking the parsed ``argparse.Namespace`` and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import cast

from specon import __version__

# Order is the order shown in --help.
COMMANDS = ("demo", "status", "drain", "classify", "config", "trace", "sim", "learn", "asgd", "systemd")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specon",
        description="Speculative container scheduling for deep-learning training clusters.",
    )
    parser.add_argument("--version", action="version", version=f"specon {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"specon.cli.cmd_{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func = cast(Callable[[argparse.Namespace], int], args.func)
    try:
        return func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
