"""The single `asp` command.

Each subcommand lives in `mindspeed_asp/commands/<name>.py` and exposes `register(subparsers)`; heavy
libraries are imported inside the command's handler so `asp --help` and `asp plan` start fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from mindspeed_asp import __version__
from mindspeed_asp.errors import AspError

# Order is the order shown in `asp --help`.
COMMAND_MODULES = [
    "demo",
    "lengths",
    "plan",
    "simulate",
    "fit_cost",
    "train",
    "compare",
    "doctor",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asp",
        description="ASP: offline rollout scheduling and asynchronous multi-instance RL for MindSpeed-RL.",
    )
    parser.add_argument("--version", action="version", version=f"mindspeed-asp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"mindspeed_asp.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"mindspeed_asp.commands.{name}":
                continue  # command not shipped in this build
            raise
        module.register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except AspError as exc:
        print(f"asp {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"asp {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
