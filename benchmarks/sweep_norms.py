"""The two memory-bound misses on the H200: the softmax backward (16384x8192 bf16) and the fused residual add +
RMSNorm forward (16384x4096 bf16), each seed's default and its `RowVariant`s (seeds/softmax_bwd.py) against eager
PyTorch, torch.compile and Liger (when importable), in one run.

    python3 benchmarks/sweep_norms.py [--budget 75] [--out DIR]          # H200 (not yet run): table last
    TRITON_INTERPRET=1 python3 benchmarks/sweep_norms.py --smoke          # CPU interpreter, tiny shapes

Liger is timed when `liger_kernel` imports (on the device machine: pip install --no-deps --target /tmp/site
.whl/liger_kernel-0.8.5-py3-none-any.whl and PYTHONPATH=/tmp/site). Not yet run on the GPU: about 27 Triton
compiles and two torch.compile graphs, estimated at 60-80 s; the budget guard stops new rows after 75 s.

Every implementation is first checked against float64 at the full shape (relative L2 below 1e-2 on every output;
the residual op checks both the normed y and the sum h, and says where h is not x + residual bit for bit); a wrong
one prints WRONG and is not timed. Times are do_bench medians (warmup 25 ms, rep 100 ms) rotating over three input
sets. Backward baselines are the backward alone (autograd.grad over a graph built once from the saved y), as in
docs/bench-norms.md; the seed's "from x" rows are the backward task's contract (x, dy) -> dx, same bytes.
Per op: baselines first (eager, Liger, torch.compile), then the seed's default, then the variants in order of
promise; no new row starts after --budget seconds (those rows say "skipped").
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._bench import parser, rel_l2, rotating_median_ms  # noqa: E402
from benchmarks._rows import ROWS, Row, announce, copy_bandwidth, device_for, finish, liger_available  # noqa: E402
from seeds import rmsnorm, softmax  # noqa: E402
from seeds.rmsnorm_residual import rmsnorm_residual_rows  # noqa: E402
from seeds._common import RowVariant  # noqa: E402
from seeds.softmax_bwd import softmax_bwd_rows  # noqa: E402

START = time.time()
SETS = 3
DT = torch.bfloat16
TOL = 1e-2  # relative L2 against float64: bf16 rounding gives 2e-3 to 3e-3


def measure(op: str, impl: str, kind: str, nbytes: int, build: Callable[[], tuple[Callable[[int], object], list,
            list]], budget: float, smoke: bool, exact: Callable[[list], str] | None = None) -> None:
    """build() -> (fn(i) for input set i, outputs of set 0, float64 truths). Check, then time; never raises."""
    row = Row(op, impl, kind)
    ROWS.append(row)
    if time.time() - START > budget:
        row.status = "skipped (budget)"
        print(f"  {op:<26} {impl:<44} skipped (budget)", flush=True)
        return
    try:
        fn, outs, truths = build()
        row.rel_l2 = max(rel_l2(o, t) for o, t in zip(outs, truths))
        row.note = exact(outs) if exact else ""
        if not row.rel_l2 < TOL:
            row.status = "WRONG"
        else:
            row.ms = rotating_median_ms(fn, SETS, smoke)
            row.gbps = nbytes / row.ms / 1e6
            row.status = "ok"
    except Exception as exc:  # noqa: BLE001 - one failing implementation must not hide the others
        row.status = f"FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
    print(f"  {op:<26} {impl:<44} {row.status:<6} {row.ms or float('nan'):8.4f} ms  "
          f"{row.gbps or float('nan'):7.0f} GB/s  rel_l2 {row.rel_l2}  {row.note}  t={time.time() - START:.0f}s",
          flush=True)


def liger_op(name: str):
    import importlib
    return importlib.import_module(f"liger_kernel.ops.{name}")


# ---- softmax backward ----------------------------------------------------------------------------------------------

SOFTMAX_Y_VARIANTS = [  # from the saved y
    ("row w16", RowVariant(num_warps=16)),
    ("row w16 .cs", RowVariant(num_warps=16, store_cache=".cs")),
    ("row w16 evict_first .cs", RowVariant(num_warps=16, load_policy="evict_first", store_cache=".cs")),
    ("row w16 maxnreg40", RowVariant(num_warps=16, maxnreg=40)),
    ("row w16 maxnreg32", RowVariant(num_warps=16, maxnreg=32)),
    ("row w16 persistent 1/SM prefetch", RowVariant(num_warps=16, programs_per_sm=1, prefetch=True)),
    ("row w16 persistent 2/SM prefetch", RowVariant(num_warps=16, programs_per_sm=2, prefetch=True)),
    ("two-pass chunk 2048 w16", RowVariant(num_warps=16, chunk=2048)),
    ("two-pass chunk 2048 w8", RowVariant(num_warps=8, chunk=2048)),
    ("two-pass chunk 8192 w16", RowVariant(num_warps=16, chunk=8192)),
]
SOFTMAX_X_VARIANTS = [  # from x (the task's contract), recomputing y in registers
    ("row w8", RowVariant(num_warps=8)),
    ("row w16", RowVariant(num_warps=16)),
    ("row w16 maxnreg40", RowVariant(num_warps=16, maxnreg=40)),
    ("row w16 persistent 2/SM prefetch", RowVariant(num_warps=16, programs_per_sm=2, prefetch=True)),
    ("row w8 persistent 1/SM prefetch", RowVariant(num_warps=8, programs_per_sm=1, prefetch=True)),
]


def _grad_graphs(forward, sets):
    """(y, x, dy) per input set with y = forward(x) built once, so the backward alone is timed."""
    out = []
    for x, dy in sets:
        xr = x.detach().requires_grad_()
        out.append((forward(xr), xr, dy))
    return out


def _grad(y, x, dy):
    return torch.autograd.grad(y, x, dy, retain_graph=True)[0]


def sweep_softmax_bwd(m: int, n: int, device: str, budget: float, smoke: bool) -> None:
    op = f"softmax bwd {m}x{n}"
    nbytes = 2 * 3 * m * n  # bf16: read y (or x) and dy, write dx
    sets = [(torch.randn(m, n, device=device, dtype=DT), torch.randn(m, n, device=device, dtype=DT))
            for _ in range(SETS)]
    ysets = [(torch.softmax(x, -1), dy) for x, dy in sets]
    x64 = sets[0][0].double().requires_grad_()
    truth = [torch.autograd.grad(torch.softmax(x64, -1), x64, sets[0][1].double())[0]]
    del x64

    def graph_baseline(forward):
        def build():
            graphs = _grad_graphs(forward, sets)
            return (lambda i: _grad(*graphs[i])), [_grad(*graphs[0])], truth
        return build

    def ours(call, inputs):
        def build():
            return (lambda i: call(*inputs[i])), [call(*inputs[0])], truth
        return build

    measure(op, "eager torch.softmax (bwd only, from y)", "baseline", nbytes,
            graph_baseline(lambda x: torch.softmax(x, -1)), budget, smoke)
    if liger_available():
        measure(op, "liger (bwd only, from y)", "baseline", nbytes,
                graph_baseline(lambda x: liger_op("softmax").LigerSoftmaxFunction.apply(x)), budget, smoke)
    else:
        ROWS.append(Row(op, "liger", "baseline", status="skipped (not importable)"))
    measure(op, "torch.compile (bwd only, from y)", "baseline", nbytes,
            graph_baseline(torch.compile(lambda x: torch.softmax(x, -1))), budget, smoke)
    measure(op, "seed default, from y", "seed", nbytes,
            ours(lambda y, dy: softmax.softmax_bwd(y, dy, from_input=False), ysets), budget, smoke)
    measure(op, "seed default, from x (the task)", "seed", nbytes,
            ours(lambda x, dy: softmax.softmax_bwd(x, dy, from_input=True), sets), budget, smoke)
    for label, v in SOFTMAX_Y_VARIANTS:
        measure(op, f"from y: {label}", "variant", nbytes,
                ours(lambda y, dy, v=v: softmax_bwd_rows(y, dy, from_input=False, variant=v), ysets), budget, smoke)
    for label, v in SOFTMAX_X_VARIANTS:
        measure(op, f"from x: {label}", "variant", nbytes,
                ours(lambda x, dy, v=v: softmax_bwd_rows(x, dy, from_input=True, variant=v), sets), budget, smoke)


# ---- fused residual add + RMSNorm ----------------------------------------------------------------------------------

RESIDUAL_VARIANTS = [
    ("row w8", RowVariant(num_warps=8)),
    ("row w4", RowVariant(num_warps=4)),
    ("row w16", RowVariant(num_warps=16)),
    ("row w8 .cs", RowVariant(num_warps=8, store_cache=".cs")),
    ("row w8 evict_first .cs", RowVariant(num_warps=8, load_policy="evict_first", store_cache=".cs")),
    ("row w8 persistent 4/SM", RowVariant(num_warps=8, programs_per_sm=4)),
    ("row w8 persistent 4/SM prefetch", RowVariant(num_warps=8, programs_per_sm=4, prefetch=True)),
    ("row w16 persistent 2/SM prefetch", RowVariant(num_warps=16, programs_per_sm=2, prefetch=True)),
]


def sweep_residual(m: int, n: int, device: str, budget: float, smoke: bool, eps: float = 1e-6) -> None:
    op = f"add+rmsnorm fwd {m}x{n}"
    nbytes = 2 * (4 * m * n + n)  # bf16: read x, residual, w; write y, h
    w = (1 + 0.1 * torch.randn(n, device=device)).to(DT)
    sets = [(torch.randn(m, n, device=device, dtype=DT), torch.randn(m, n, device=device, dtype=DT))
            for _ in range(SETS)]
    h0 = sets[0][0] + sets[0][1]  # the unfused model's residual stream, rounded to bf16
    # y's truth is the float64 norm of that rounded sum; h's is the exact sum.
    truth = [F.rms_norm(h0.double(), (n,), w.double(), eps), sets[0][0].double() + sets[0][1].double()]

    def exact(outs):
        return "" if torch.equal(outs[1], h0) else "h != x + residual bit for bit"

    def build_for(call):
        def build():
            return (lambda i: call(*sets[i])), list(call(*sets[0])), truth
        return build

    def eager(x, r):
        h = x + r
        return F.rms_norm(h, (n,), w, eps), h

    measure(op, "eager add + F.rms_norm", "baseline", nbytes, build_for(eager), budget, smoke, exact)
    if liger_available():
        measure(op, "liger fused_add_rms_norm", "baseline", nbytes,
                build_for(lambda x, r: liger_op("fused_add_rms_norm").LigerFusedAddRMSNormFunction.apply(x, r, w, eps)),
                budget, smoke, exact)
    else:
        ROWS.append(Row(op, "liger", "baseline", status="skipped (not importable)"))
    measure(op, "torch.compile", "baseline", nbytes, build_for(torch.compile(eager)), budget, smoke, exact)
    measure(op, "seed default", "seed", nbytes,
            build_for(lambda x, r: rmsnorm.rmsnorm_residual_fwd(x, r, w, eps)), budget, smoke, exact)
    measure(op, "seed rows=2 w16", "variant", nbytes,
            build_for(lambda x, r: rmsnorm.rmsnorm_residual_fwd(x, r, w, eps, rows=2, num_warps=16)), budget, smoke,
            exact)
    for label, v in RESIDUAL_VARIANTS:
        measure(op, label, "variant", nbytes,
                build_for(lambda x, r, v=v: rmsnorm_residual_rows(x, r, w, eps, v)), budget, smoke, exact)


def main() -> int:
    ap = parser(__doc__.splitlines()[0], budget_s=75.0)
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for sweep_norms.json (default: $OUT)")
    args = ap.parse_args()
    device = device_for(args.smoke)
    if device is None:
        return 2
    env = announce(device)
    copy_gbps = copy_bandwidth(device, args.smoke)
    softmax_shape, residual_shape = ((24, 256), (24, 128)) if args.smoke else ((16384, 8192), (16384, 4096))
    sweep_softmax_bwd(*softmax_shape, device, args.budget, args.smoke)
    if device == "cuda":
        torch.cuda.empty_cache()
    sweep_residual(*residual_shape, device, args.budget, args.smoke)
    return finish(args.out, "sweep_norms.json", env, copy_gbps, START)


if __name__ == "__main__":
    sys.exit(main())
