"""The `crucible` command: parses arguments and hands each subcommand to one library call.

Each subcommand lives in agent/commands/<name>.py and exposes `register(subparsers)` (adds its parser, with
`func=run`) and `run(args) -> int`. Exit codes: 0 success/accepted, 1 rejected/failed, 2 bad invocation.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from rich.console import Console

import agent.commands

err_console = Console(stderr=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crucible", description="Write and optimise fused Triton kernels, verified.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the library does")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(agent.commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        importlib.import_module(f"agent.commands.{info.name}").register(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("kernel-crucible")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        err_console.print("interrupted; everything recorded so far is kept.")
        return 130
    except Exception as exc:  # noqa: BLE001 - a fault of crucible's, not the user's: one sentence, details on -v
        if args.verbose:
            raise
        err_console.print(f"crucible failed inside `{args.command}`: {type(exc).__name__}: {str(exc)[:300]} "
                          "(this is a bug in crucible, not in your input; rerun with -v for the traceback)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
