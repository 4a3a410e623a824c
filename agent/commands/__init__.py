"""One module per `crucible` subcommand; see agent/cli.py for the contract."""

import argparse

# The baselines profiler.baselines can build (its KNOWN; kept here too so the CLI validates flags without torch).
BASELINES = ("eager", "compile", "liger", "vendor")


def add_timing_mode(p: argparse.ArgumentParser) -> None:
    """--timing-mode, shared by `check` and `bench` (sandbox.timing_parent.pacing reads it)."""
    p.add_argument("--timing-mode", choices=("auto", "isolated", "sustained"), default="auto",
                   help="isolated: one call at a time, the device idle in between; sustained: after 100 ms of "
                        "untimed calls, bursts of 10 back to back, at the clock a busy GPU settles at; auto "
                        "(default): sustained for compute-bound tasks, isolated for memory-bound ones")


def add_constants(p: argparse.ArgumentParser) -> None:
    """--set NAME=VALUE (repeatable) and --no-rescale, shared by every command that loads a task."""
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", dest="constants",
                   help="replace one of the task's integer constants (repeatable), e.g. --set N0=250000000; "
                        "values the task file derives from it follow, and the CPU never rescales it")
    p.add_argument("--no-rescale", action="store_true",
                   help="on the CPU, keep the task's own sizes instead of shrinking them for the interpreter")


def parse_constants(items: list[str]) -> dict[str, int]:
    """['N0=4096', ...] -> {'N0': 4096}; ValueError with one sentence for a malformed item."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = int(value.replace("_", ""))
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise ValueError(f"--set {item!r}: write NAME=INTEGER, e.g. --set N0=250000000")
    return out
