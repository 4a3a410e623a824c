"""What the GPU bench scripts share: their --smoke / --budget options, a median time over rotating input sets, and
the relative L2 error."""
from __future__ import annotations

import argparse
import time
from typing import Callable

import torch


def parser(description: str, budget_s: float) -> argparse.ArgumentParser:
    """--smoke (the CPU interpreter at tiny shapes: checks the script only) and --budget (seconds after which no
    new row starts); a script adds its own options."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter at tiny shapes: checks the script only")
    ap.add_argument("--budget", type=float, default=budget_s,
                    help=f"seconds after which no new row starts (default {budget_s:g})")
    return ap


def rotating_median_ms(fn: Callable[[int], object], sets: int, smoke: bool) -> float:
    """Median ms of fn(i % sets) under do_bench, each call on the next input set (the L2 never holds them all).
    smoke: one wall-clock call after a warm-up, for checking a script on the CPU interpreter."""
    state = {"i": 0}

    def call() -> None:
        fn(state["i"] % sets)
        state["i"] += 1

    if smoke:
        call()
        start = time.perf_counter()
        call()
        return (time.perf_counter() - start) * 1e3
    import triton.testing
    return triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")


def rel_l2(got: torch.Tensor, truth: torch.Tensor) -> float:
    """||got - truth|| / ||truth|| in float64 (the absolute error where truth is zero); inf when got is not finite."""
    g, t = got.detach().double(), truth.detach().double()
    if not torch.isfinite(g).all():
        return float("inf")
    n = float(t.norm())
    return float((g - t).norm()) / (n if n else 1.0)
