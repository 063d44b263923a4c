"""The single `asp` command.

Each subcommand lives in `mindspeed_asp/commands/<name>.py` and exposes `register(subparsers)`; heavy
libraries are imported inside the command's handler so `asp --help` and `asp plan` start fast.

Every error a user can cause ends the command with one line on stderr (`asp <command>: error: ...`, naming
the file, line or option), exit status 2 and no traceback: command-line parse errors, AspError from the
commands, and, as a last resort, OS errors, memory exhaustion and a missing optional extra.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from mindspeed_asp import __version__
from mindspeed_asp.errors import AspError
from mindspeed_asp.utils.extras import extra_for_import_error

# Order is the order shown in `asp --help`.
COMMAND_MODULES = [
    "demo",
    "lengths",
    "plan",
    "simulate",
    "whatif",
    "fit_cost",
    "train",
    "compare",
    "doctor",
]


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (the usage block is what `--help` is for)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version or a one-line parse error: the status, as for any command
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except AspError as exc:
        return _fail(args, str(exc))
    except ModuleNotFoundError as exc:
        message = extra_for_import_error(exc, f"asp {args.command}")
        if message is None:
            raise  # a module of this package or a core dependency: a bug or a broken install, keep the trace
        return _fail(args, message)
    except MemoryError:
        return _fail(args, "out of memory; use smaller sizes (instances, slots, prompts, n)")
    except OSError as exc:  # an OS refusal no check foresaw (disk full, permissions changed mid-run)
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(args, f"{where}{exc.strerror or exc}")
    except KeyboardInterrupt:
        print(f"asp {args.command}: interrupted", file=sys.stderr)
        return 130


def _fail(args: argparse.Namespace, message: str) -> int:
    print(f"asp {args.command}: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
