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
