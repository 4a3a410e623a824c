"""`crucible check TASK CANDIDATE`: run a candidate through the staged harness; `--reference` checks the task itself.

Exit codes: 0 accepted (or a usable task with --reference), 1 rejected, 2 bad invocation or unusable task.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from . import add_constants, add_timing_mode, parse_constants

console = Console()
err_console = Console(stderr=True)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("check", help="check a candidate kernel against a task (sandboxed, staged)",
                              description=__doc__)
    p.add_argument("task", help="task file in KernelBench format (Model, get_inputs, get_init_inputs)")
    p.add_argument("candidate", nargs="?", help="candidate file defining ModelNew")
    p.add_argument("--reference", action="store_true", help="check the task itself: loads, runs, depends on its inputs")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="cpu runs all but timing through Triton's interpreter; default cuda when available")
    p.add_argument("--no-timing", action="store_true", help="skip the GPU timing stage")
    p.add_argument("--baselines", default="eager",
                   help="timing-stage baselines: eager, compile, liger, vendor (comma-separated)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="wall-clock limit per candidate")
    p.add_argument("--seed", type=int, default=None, help="fix the (otherwise hidden, random) seed")
    p.add_argument("--gpu", type=int, default=0, metavar="N", help="CUDA device index")
    p.add_argument("--incumbent-ms", type=float, default=None, metavar="MS",
                   help="the time to beat: timing stops once the candidate's interval lies above it (+5%%), and a "
                        "close contest is timed longer")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    add_timing_mode(p)
    add_constants(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from sandbox.harness import CheckOptions, Harness
    from sandbox.reference import check_task
    from sandbox.task import TaskError, load_task

    device = args.device
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu" and not args.json:
            err_console.print("no CUDA GPU found: checking correctness on the CPU through Triton's interpreter "
                              "(nothing is timed)")
    elif device == "cuda" and not torch.cuda.is_available():
        err_console.print("--device cuda needs a CUDA GPU and none is visible; use --device cpu")
        return 2
    try:
        task = load_task(args.task, parse_constants(args.constants), rescale=not args.no_rescale)
    except (TaskError, ValueError) as exc:
        return _bad(args, str(exc))

    if args.reference:
        try:
            sized = task.scaled_for_cpu() if device == "cpu" else task
            summary = check_task(sized, device)
        except TaskError as exc:
            return _bad(args, str(exc))
        rescaled = {k: v for k, v in sized.overrides.items() if k not in sized.pinned}
        if args.json:
            print(json.dumps({"verdict": "usable", "task": str(task.path), **summary, "rescaled": rescaled,
                              "note": sized.rescale_note or None}))
        else:
            console.print(f"[green]usable[/green] {task.path.name}: outputs "
                          + ", ".join(f"{o['dtype']}{o['shape']}" for o in summary["outputs"])
                          + ("" if summary["float64_reference"] else " (no float64 reference: compared in its own dtype)"),
                          markup=False if "[" in task.path.name else None, highlight=False, soft_wrap=True)
            if rescaled:
                console.print("rescaled for the CPU: " + ", ".join(f"{k}={v}" for k, v in rescaled.items())
                              + " (--no-rescale keeps the task's own size)", highlight=False, soft_wrap=True)
            if sized.rescale_note:
                console.print(sized.rescale_note, markup=False, highlight=False, soft_wrap=True)
        return 0

    if not args.candidate:
        return _bad(args, "give a CANDIDATE file to check (or --reference to check the task itself)")
    candidate = Path(args.candidate)
    if not candidate.exists():
        return _bad(args, f"candidate file {candidate} does not exist; pass the .py file that defines ModelNew")
    if not candidate.is_file() or candidate.suffix != ".py":
        return _bad(args, f"candidate {candidate} is not a .py file; pass the file that defines ModelNew")
    not_candidate = _not_a_candidate(candidate)
    if not_candidate:
        return _bad(args, not_candidate)
    baselines = tuple(b.strip() for b in args.baselines.split(",") if b.strip())
    try:
        options = CheckOptions(device=device, timing=not args.no_timing, timeout_s=args.timeout, seed=args.seed,
                               gpu=args.gpu, baselines=baselines, timing_mode=args.timing_mode,
                               incumbent_ms=args.incumbent_ms)
    except ValueError as exc:
        return _bad(args, f"--incumbent-ms: {exc}")
    try:
        with Harness(device) as harness:
            result = harness.check(task, candidate, options)
    except TaskError as exc:
        return _bad(args, str(exc))
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        render(result)
    return 0 if result.accepted else 1


def _not_a_candidate(path: Path) -> str | None:
    """A sentence when the file is no candidate at all (empty, or no ModelNew anywhere in it): a bad invocation, not
    a rejected kernel. A file that mentions ModelNew but does not parse is a candidate, and the harness rejects it."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"cannot read candidate {path}: {exc.strerror or exc}"
    if not text.strip():
        return f"candidate {path} is empty; pass the .py file that defines ModelNew"
    if "ModelNew" not in text:
        return f"{path} defines no ModelNew, so it is not a candidate; pass the .py file that defines class ModelNew"
    return None


def _bad(args: argparse.Namespace, message: str) -> int:
    if args.json:
        print(json.dumps({"verdict": "error", "stage": None, "reason": "bad_invocation", "message": message}))
    else:
        err_console.print(message)
    return 2


def render(result) -> None:
    colour = "green" if result.accepted else "red"
    console.print(f"[bold {colour}]{result.verdict.value}[/bold {colour}] at stage [bold]{result.stage.value}[/bold]"
                  f" ({result.reason.value}) in {result.seconds:.1f} s on {result.device}")
    table = Table(show_header=True, header_style="bold")
    table.add_column("stage")
    table.add_column("result")
    table.add_column("s", justify="right")
    table.add_column("notes", overflow="fold")
    for s in result.stages:
        notes = ""
        if s.stage.value == "correctness" and s.passed:
            notes = "distributions: " + ", ".join(s.details.get("distributions", []))
        elif s.stage.value == "robustness" and s.passed:
            notes = "shapes: " + "; ".join(", ".join(f"{k}={v}" for k, v in v.items()) for v in s.details.get("shapes", []))
        elif not s.passed:
            notes = s.reason.value
        table.add_row(s.stage.value, "[green]pass[/green]" if s.passed else "[red]fail[/red]", f"{s.seconds:.2f}", notes)
    console.print(table)
    if not result.accepted:
        console.print(result.message, markup=False, highlight=False)
    elif not result.timed:
        console.print("not timed: correctness only" + (" (the CPU interpreter cannot time kernels)"
                                                       if result.device == "cpu" else ""))
    elif result.timing:
        for name, b in (result.timing.get("baselines") or {}).items():
            if b.get("speedup") is not None:
                console.print(f"vs {name}: {b['speedup']:.2f}x [{b['ci_low']:.2f}, {b['ci_high']:.2f}] "
                              f"({b.get('verdict', '')})")
        race = result.timing.get("race")
        if race:
            console.print(f"vs the incumbent's {race['incumbent_ms']:.4g} ms: {race['verdict']} after "
                          f"{race['rounds']} timed calls ({race['rule']})", markup=False, highlight=False)
