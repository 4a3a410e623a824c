"""What the GPU bench scripts share: their --smoke / --budget options, a median time over rotating input sets, the
relative L2 error, the commit a measurement is recorded under, and appending rows to a CSV."""
from __future__ import annotations

import argparse
import csv
import subprocess
import time
from pathlib import Path
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


def attention_truth(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                    chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(o fp32, natural lse fp64) of the float64 softmax attention over [B, H, S, D], `chunk` (batch, head) pairs
    at a time (S x S in fp64); causal top-left aligned."""
    import math
    b, h, s, d = q.shape
    qf, kf, vf = (t.reshape(b * h, s, d) for t in (q, k, v))
    o = torch.empty(b * h, s, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(b * h, s, dtype=torch.float64, device=q.device)
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril() if causal else None
    for i in range(0, b * h, chunk):
        sl = slice(i, i + chunk)
        scores = (qf[sl].double() @ kf[sl].double().transpose(1, 2)) / math.sqrt(d)
        if mask is not None:
            scores.masked_fill_(~mask, float("-inf"))
        lse[sl] = torch.logsumexp(scores, dim=-1)
        o[sl] = (torch.exp(scores - lse[sl][..., None]) @ vf[sl].double()).float()
        del scores
    return o.view(b, h, s, d), lse.view(b, h, s)


def selection_options(ap: argparse.ArgumentParser, what: str = "Gluon variants") -> None:
    """--only / --skip (comma-separated substrings of the rows' names) and --mode, to narrow a rerun (say, past a
    variant that hung)."""
    ap.add_argument("--only", default="", help=f"comma-separated substrings: run only the {what} naming one")
    ap.add_argument("--skip", default="", help=f"comma-separated substrings: leave out the {what} naming one")
    ap.add_argument("--mode", choices=("both", "full", "causal"), default="both", help="non-causal, causal or both")


def selected(name: str, args: argparse.Namespace) -> bool:
    """Whether --only / --skip keep the row `name`."""
    only = [w for w in args.only.split(",") if w]
    skip = [w for w in args.skip.split(",") if w]
    return (not only or any(w in name for w in only)) and not any(w in name for w in skip)


def modes(args: argparse.Namespace) -> tuple[bool, ...]:
    """The causal flags --mode asks for: (False, True), (False,) or (True,)."""
    return {"both": (False, True), "full": (False,), "causal": (True,)}[args.mode]


def versions() -> str:
    """torch and triton versions and the device, the first line a sweep prints."""
    import triton
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    return f"torch {torch.__version__}, triton {triton.__version__}, {device}"


def commit(root: Path) -> str:
    """The commit of the tree at `root`: its COMMIT file where the tree was exported without git (a copy sent to a GPU
    machine carries one), else HEAD's short hash with '+dirty' when tracked files differ; '' if neither is known."""
    stamp = root / "COMMIT"
    if stamp.exists():
        return stamp.read_text().strip()[:12]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return ""
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=30)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def task_files(names: str, root: Path) -> tuple[list[Path], str | None]:
    """The task files `names` (comma-separated, in tasks/, ".py" optional) name, and the sentence to print where one
    is missing or none is named (None when all are there)."""
    tasks = [root / "tasks" / (t if t.endswith(".py") else f"{t}.py") for t in names.split(",") if t.strip()]
    missing = [str(t.relative_to(root)) for t in tasks if not t.exists()]
    if missing or not tasks:
        return tasks, f"no such task: {', '.join(missing) or '(none given)'}; name files in tasks/"
    return tasks, None


def append_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    """Append rows (only `fields`, in that order) to a CSV, writing the header when the file is new."""
    new = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerows(rows)
