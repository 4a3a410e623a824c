"""`crucible bench TASK [CANDIDATE]`: time a candidate against the task's baselines on a CUDA GPU.

The harness runs the timing in its sandbox (profiler.timing in the child, validation in the parent) and returns the
report of profiler.report; this command only renders it. `--ceilings` prints the device's measured copy bandwidth and
matmul rates that the roofline uses (measured once and cached).
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from . import add_constants, add_timing_mode, parse_constants

console = Console()
err_console = Console(stderr=True)

NO_GPU = "timing needs a CUDA GPU; run crucible check --device cpu for correctness"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="time a candidate against eager / torch.compile / Liger baselines (GPU)",
                              description=__doc__)
    p.add_argument("task", nargs="?", help="task file (KernelBench format)")
    p.add_argument("candidate", nargs="?", help="candidate file defining ModelNew; omit to time the baselines only")
    p.add_argument("--baselines", default="eager,compile,liger,vendor",
                   help="comma-separated: eager, compile, liger, vendor (default: all four; liger and vendor "
                        "where the task names such a kernel)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    add_constants(p)
    p.add_argument("--csv", metavar="FILE", help="also write one row per implementation to FILE")
    p.add_argument("--ceilings", action="store_true", help="print the device's measured ceilings (cached)")
    p.add_argument("--gpu", type=int, default=0, metavar="N", help="CUDA device index (default 0)")
    add_timing_mode(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from profiler.baselines import parse_names

    if not torch.cuda.is_available():
        err_console.print(NO_GPU)
        return 2
    if not 0 <= args.gpu < torch.cuda.device_count():
        err_console.print(f"--gpu {args.gpu} does not exist: this machine has {torch.cuda.device_count()} CUDA "
                          f"device(s), numbered from 0")
        return 2
    if args.ceilings:
        from profiler.ceilings import get_ceilings

        ceil = get_ceilings(args.gpu)
        if args.json and not args.task:
            console.print_json(json.dumps(ceil))
        else:
            render_ceilings(ceil)
        if not args.task:
            return 0
    if not args.task:
        err_console.print("give a TASK file to time (crucible bench TASK [CANDIDATE]), or --ceilings alone")
        return 2
    try:
        names = parse_names(args.baselines)
    except ValueError as exc:
        err_console.print(str(exc))
        return 2
    from sandbox.task import TaskError, load_task

    try:
        task = load_task(args.task)
        constants = parse_constants(args.constants)
        task = task.with_constants(constants) if constants else task
    except (TaskError, ValueError) as exc:
        err_console.print(str(exc))
        return 2
    candidate = None
    if args.candidate:
        candidate = Path(args.candidate)
        if not candidate.is_file():
            err_console.print(f"candidate file {candidate} does not exist; pass a .py file that defines ModelNew")
            return 2
    try:
        from sandbox.harness import Harness
    except ImportError as exc:
        err_console.print(f"the harness cannot be imported ({exc}); reinstall crucible")
        return 1
    with Harness(device="cuda") as harness:
        timing = harness.bench(task, candidate, baselines=names, gpu=args.gpu, timing_mode=args.timing_mode)
    if args.json:
        console.print_json(json.dumps(timing, default=str))
    else:
        render(timing, title=f"{task.name}" + (f" — {candidate.name}" if candidate else " — baselines"))
    if args.csv:
        write_csv(timing, Path(args.csv))
    return 1 if timing.get("problems") else 0


def _speedup_cell(vs: dict[str, Any] | None) -> str:
    """'2.99× 2.97–3.01' in green (faster), red (slower) or dim (no significant difference)."""
    if not vs:
        return "–"
    style = {"faster": "green", "slower": "red"}.get(vs["verdict"], "dim")
    return f"[{style}]{vs['speedup']:.2f}× {vs['ci_low']:.2f}–{vs['ci_high']:.2f}[/]"


def render(timing: dict[str, Any], title: str = "") -> None:
    """The table: impl, median, IQR, GB/s or TFLOP/s, % of roofline, speedup with CI vs each baseline."""
    roof = timing.get("roofline") or {}
    rate_key = "tflops" if roof.get("bound") == "compute" else "gbps"
    rate_name = "TFLOP/s" if rate_key == "tflops" else "GB/s"
    baselines = list(timing.get("baselines", {}))
    table = Table(title=title or None)
    for col in ("impl", "median ms", "IQR ms", rate_name, "% roof"):
        table.add_column(col, justify="left" if col == "impl" else "right", no_wrap=True)
    for b in baselines:
        table.add_column(f"vs {b}", justify="right", no_wrap=True)
    for row in timing.get("rows", []):
        if row["ms"] is None:
            table.add_row(row["impl"], "[dim]unavailable[/]", "", "", "", *["" for _ in baselines])
            continue
        rate = row.get(rate_key)
        pct = row.get("pct_of_roofline")
        table.add_row(row["impl"], f"{row['ms']:.4f}", f"{row['iqr_ms']:.4f}",
                      f"{rate:,.0f}" if rate is not None else "–", f"{pct:.0f}%" if pct is not None else "–",
                      *[_speedup_cell(row["vs"].get(b)) if b != row["impl"] else "" for b in baselines])
    console.print(table)
    console.print("[dim]speedup = baseline time / this time, median of paired rounds, 95% bootstrap interval; "
                  "[green]green[/green] faster, [red]red[/red] slower, grey no significant difference[/]")
    m = timing.get("measurement") or {}
    if m:
        how = (f"sustained: bursts of {m.get('burst')} back to back after {m.get('settle_ms', 0):.0f} ms of untimed "
               "calls" if m.get("burst", 1) > 1 else "isolated: one call at a time")
        console.print(f"[dim]{m.get('reps')} timed calls each, {how}; L2 flushed before each[/]")
    for row in timing.get("rows", []):
        if row["ms"] is None:
            console.print(f"[dim]{row['impl']}: {row['note']}[/]")
    if roof:
        console.print(f"roofline: {roof['bytes']:,} bytes ({roof.get('bytes_source', '')}), {roof['flops']:,.0f} FLOPs "
                      f"({roof.get('flops_source', '')}); {roof['bound']}-bound, floor {roof['floor_ms']:.4f} ms at "
                      f"{roof.get('copy_gbps') or 0:,.0f} GB/s, {roof.get('peak_tflops') or 0:,.0f} TFLOP/s "
                      f"{roof.get('peak_dtype') or ''}")
    for k in timing.get("kernels", []):
        console.print(f"kernel {k['name']}: {k['registers']} regs, {k['spills']} spills, {k['shared_bytes']} B shared, "
                      f"{k['num_warps']} warps, {k['num_stages']} stages")
    for p in timing.get("problems", []):
        console.print(f"[red]{p['reason']}[/]: {p['message']}")
    for w in timing.get("warnings", []):
        console.print(f"[yellow]warning[/]: {w}")
    env = timing.get("environment") or {}
    gpu = (env.get("gpu") or {}).get("name")
    if env:
        console.print(f"[dim]{gpu}, driver {env.get('driver')}, CUDA {env.get('cuda')}, torch {env.get('torch')}, "
                      f"triton {env.get('triton')}, liger {env.get('liger_kernel')}[/]")


def render_ceilings(ceil: dict[str, Any]) -> None:
    table = Table(title=f"ceilings — {ceil.get('gpu')} ({'cached' if ceil.get('cached') else 'measured now'})")
    table.add_column("ceiling")
    table.add_column("measured", justify="right")
    table.add_row("device-to-device copy (read + write)", f"{ceil['copy_gbps']:,.0f} GB/s")
    for dtype, rate in ceil.get("matmul_tflops", {}).items():
        table.add_row(f"matmul 8192³ {dtype}", f"{rate:,.1f} TFLOP/s")
    console.print(table)
    console.print(f"[dim]{ceil.get('key')}; {ceil.get('method')}; measured {ceil.get('measured_at')}[/]")


CSV_FIELDS = ["impl", "ms", "iqr_ms", "gbps", "tflops", "pct_of_roofline", "vs", "speedup", "ci_low", "ci_high",
              "verdict", "note"]


def write_csv(timing: dict[str, Any], path: Path) -> None:
    """One line per (implementation, baseline compared against); implementations without comparisons get one line."""
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        w.writeheader()
        for row in timing.get("rows", []):
            base = {k: row.get(k) for k in ("impl", "ms", "iqr_ms", "gbps", "tflops", "pct_of_roofline", "note")}
            if not row.get("vs"):
                w.writerow(base)
            for b, c in row.get("vs", {}).items():
                w.writerow({**base, "vs": b, **c})
