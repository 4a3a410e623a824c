"""The norm backwards on the H200: RMSNorm (dx, dw) and LayerNorm (dx, dw, db) at 16384x4096 bf16, the seeds'
defaults and their options (seeds/rmsnorm.py, seeds/layernorm.py) against eager PyTorch, torch.compile and Liger
(when importable), in one run.

    python3 benchmarks/sweep_norm_bwd.py [--budget 70] [--out DIR]        # H200 (not yet run): table last
    TRITON_INTERPRET=1 python3 benchmarks/sweep_norm_bwd.py --smoke        # CPU interpreter, tiny shapes

Liger is timed when `liger_kernel` imports (on the device machine: pip install --no-deps --target /tmp/site
.whl/liger_kernel-0.8.5-py3-none-any.whl and PYTHONPATH=/tmp/site). Estimated at 60-80 s on the H200: 16 Triton
compiles of the seeds, Liger's, and two torch.compile graphs (timed last: the slowest baseline, the first row the
budget guard drops); no new row starts after --budget seconds (those rows say "skipped").

Every implementation is first checked against float64 at the full shape (relative L2 below 1e-2 on every gradient;
bf16 rounding gives 2e-3 to 3e-3); a wrong one prints WRONG and is not timed. Seed rows also say whether a second
call gives the same bits, and every row whether it left the shared inputs as they were. Times are do_bench medians
(warmup 25 ms, rep 100 ms) rotating over three input sets. GB/s counts the tasks' CRUCIBLE_BYTES (read x, dy, w;
write dx, dw (, db)). Baselines: the backward alone (autograd.grad over a graph built once: eager, Liger,
torch.compile), as in docs/bench-norms.md, and the task's Model (forward + backward, what `crucible bench` compares
against); the seeds get (x, dy) and recompute the row statistics (the backward tasks' contract).

Why each option might win (at 16384x4096 bf16 the seed default moves 403 MB in 0.1535 ms (RMSNorm) / 0.1646 ms
(LayerNorm), 62% / 58% of copy):
- prefetch: each of the 2 programs per SM has one row of x and dy (16 KiB) in flight, and only while it waits at
  the top of a step: ~32 KiB an SM at best, under what Little's law asks at this bandwidth. The next row's loads
  issued before this row's reductions double it (sm_90: 122 / 127 registers, still 2 programs of 8 warps an SM).
- one_reduction: RMSNorm's two row sums (LayerNorm's three after the mean) in one tl.reduce: one round of
  shared-memory exchange and barriers a row instead of two (four), a shorter chain between a row's load and store.
- fused_sum: the dw (db) partials (264 x 4096 fp32) summed by the last programs to finish (a two-level ticket tree,
  fixed order, bitwise reproducible) instead of a second launch (8.7 us alone in docs/bench-norms.md).
- 16 warps: half the registers a thread; 2 programs an SM (RMSNorm, maxnreg 64) or 1 with 132 partials.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._bench import parser, rel_l2, rotating_median_ms  # noqa: E402
from benchmarks._rows import ROWS, Row, announce, copy_bandwidth, device_for, finish, liger_available  # noqa: E402
from seeds.layernorm import _layernorm_bwd_kernel, layernorm_bwd  # noqa: E402
from seeds.rmsnorm import _rmsnorm_bwd_kernel, rmsnorm_bwd  # noqa: E402

START = time.time()
SETS = 3
DT = torch.bfloat16
TOL = 1e-2
RMS_EPS, LN_EPS = 1e-6, 1e-5

# label -> keyword options of seeds.rmsnorm.rmsnorm_bwd / seeds.layernorm.layernorm_bwd, most promising first.
RMS_VARIANTS = [
    ("prefetch", dict(prefetch=True)),
    ("prefetch fused_sum", dict(prefetch=True, fused_sum=True)),
    ("prefetch one_reduction fused_sum", dict(prefetch=True, one_reduction=True, fused_sum=True)),
    ("prefetch one_reduction", dict(prefetch=True, one_reduction=True)),
    ("2/SM w16 prefetch maxnreg64", dict(programs_per_sm=2, num_warps=16, prefetch=True, maxnreg=64)),
    ("1/SM w16 prefetch fused_sum", dict(programs_per_sm=1, num_warps=16, prefetch=True, fused_sum=True)),
    ("fused_sum (no prefetch)", dict(fused_sum=True)),
]
LN_VARIANTS = [
    ("prefetch", dict(prefetch=True)),
    ("prefetch fused_sum", dict(prefetch=True, fused_sum=True)),
    ("prefetch one_reduction fused_sum", dict(prefetch=True, one_reduction=True, fused_sum=True)),
    ("prefetch one_reduction", dict(prefetch=True, one_reduction=True)),
    ("1/SM w16 prefetch fused_sum", dict(programs_per_sm=1, num_warps=16, prefetch=True, fused_sum=True)),
    ("fused_sum (no prefetch)", dict(fused_sum=True)),
    # Triton 3.9 gives the prefetch kernel 127 registers; should 3.6 give more, one program an SM: the cap keeps 2.
    ("prefetch maxnreg128", dict(prefetch=True, maxnreg=128)),
]


@dataclass
class Op:
    """One op at one shape: its input sets, float64 truths of set 0, bytes, and how to run each implementation."""
    name: str
    nbytes: int
    sets: list[tuple[torch.Tensor, torch.Tensor]]   # (x, dy) per set
    params: tuple[torch.Tensor, ...]                # (w,) or (w, b)
    truth: list[torch.Tensor]                       # float64 (dx, dw (, db)) of set 0
    functional: Callable                            # (x, *params) -> y, differentiable
    task_file: str

    def grads(self, y, x, params, dy):
        return list(torch.autograd.grad(y, (x, *params), dy, retain_graph=True))


def _compiled() -> dict[int, object]:
    """The seeds' backward kernels compiled so far (Triton's per-device cache, an internal of Triton: empty on the
    interpreter, or where its layout differs)."""
    found = {}
    try:
        for fn in (_rmsnorm_bwd_kernel, _layernorm_bwd_kernel):
            for entry in getattr(fn, "device_caches", {}).values():
                cache = entry[0] if isinstance(entry, tuple) else entry
                for kernel in getattr(cache, "values", lambda: [])():
                    found[id(kernel)] = kernel
    except Exception:  # noqa: BLE001 - a diagnostic only
        return {}
    return found


def measure(op: Op, impl: str, kind: str, build: Callable[[], Callable[[int], list]], budget: float, smoke: bool,
            repeat_check: bool = False) -> None:
    """build() -> fn(i) giving the gradients of input set i. Check set 0 against float64, then time; never raises.
    Seed rows (repeat_check) also note a second call's bits and the registers of a newly compiled kernel."""
    row = Row(op.name, impl, kind)
    ROWS.append(row)
    if time.time() - START > budget:
        row.status = "skipped (budget)"
        print(f"  {op.name:<28} {impl:<40} skipped (budget)", flush=True)
        return
    before = [t.clone() for t in op.sets[0]]
    try:
        known = _compiled()
        fn = build()
        outs = fn(0)
        row.rel_l2 = max(rel_l2(o, t) for o, t in zip(outs, op.truth))
        notes = [f"{getattr(k, 'n_regs', '?')} regs, {getattr(k, 'n_spills', '?')} spills"
                 for i, k in _compiled().items() if i not in known]
        if repeat_check:
            notes.append("bitwise repeatable" if all(torch.equal(a, b) for a, b in zip(outs, fn(0)))
                         else "NOT bitwise repeatable")
        if not row.rel_l2 < TOL:
            row.status = "WRONG"
        else:
            row.ms = rotating_median_ms(fn, SETS, smoke)
            row.gbps = op.nbytes / row.ms / 1e6
            row.status = "ok"
        if not all(torch.equal(a, b) for a, b in zip(before, op.sets[0])):
            notes.append("CHANGED ITS INPUTS")
            op.sets[0] = tuple(before)
        row.note = "; ".join(notes)
    except Exception as exc:  # noqa: BLE001 - one failing implementation must not hide the others
        row.status = f"FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
    print(f"  {op.name:<28} {impl:<40} {row.status:<6} {row.ms or float('nan'):8.4f} ms  "
          f"{row.gbps or float('nan'):7.0f} GB/s  rel_l2 {row.rel_l2}  {row.note}  t={time.time() - START:.0f}s",
          flush=True)


def make_op(kind: str, m: int, n: int, device: str) -> Op:
    w = (1 + 0.1 * torch.randn(n, device=device)).to(DT)
    sets = [(torch.randn(m, n, device=device, dtype=DT), torch.randn(m, n, device=device, dtype=DT))
            for _ in range(SETS)]
    if kind == "rmsnorm":
        params = (w,)
        nbytes = 2 * (3 * m * n + 2 * n)  # tasks/rmsnorm_bwd.py CRUCIBLE_BYTES

        def functional(x, w):
            return F.rms_norm(x, (n,), w, RMS_EPS)
    else:
        params = (w, (0.1 * torch.randn(n, device=device)).to(DT))
        nbytes = 2 * (3 * m * n + 3 * n)  # tasks/layernorm_bwd.py CRUCIBLE_BYTES

        def functional(x, w, b):
            return F.layer_norm(x, (n,), w, b, LN_EPS)
    x64 = sets[0][0].double().requires_grad_()
    p64 = [p.double().requires_grad_() for p in params]
    truth = list(torch.autograd.grad(functional(x64, *p64), (x64, *p64), sets[0][1].double()))
    del x64, p64
    return Op(f"{kind} bwd {m}x{n}", nbytes, sets, params, truth, functional, f"{kind}_bwd.py")


def graph_build(op: Op, forward: Callable) -> Callable[[], Callable[[int], list]]:
    """The backward alone: one graph per input set, built once; each call runs autograd.grad through it."""
    def build():
        graphs = []
        for x, dy in op.sets:
            xr = x.detach().requires_grad_()
            ps = [p.detach().requires_grad_() for p in op.params]
            graphs.append((forward(xr, *ps), xr, ps, dy))
        return lambda i: op.grads(*graphs[i])
    return build


def task_model_build(op: Op, device: str) -> Callable[[], Callable[[int], list]]:
    """The task's Model (forward + autograd backward), with the op's parameters: what `crucible bench` times."""
    def build():
        from sandbox.task import load_task
        n = op.sets[0][0].shape[1]
        task = load_task(ROOT / "tasks" / op.task_file).with_constants({"M": op.sets[0][0].shape[0], "N": n})
        model = task.make_reference(0, device)
        with torch.no_grad():
            model.weight.copy_(op.params[0])
            if len(op.params) > 1:
                model.bias.copy_(op.params[1])
        return lambda i: list(model(*op.sets[i]))
    return build


def seed_build(op: Op, options: dict) -> Callable[[], Callable[[int], list]]:
    def build():
        if op.name.startswith("rmsnorm"):
            (w,) = op.params
            return lambda i: list(rmsnorm_bwd(op.sets[i][0], w, op.sets[i][1], RMS_EPS, **options))
        w, b = op.params
        return lambda i: list(layernorm_bwd(op.sets[i][0], w, b, op.sets[i][1], LN_EPS, **options))
    return build


def liger_forward(op: Op) -> Callable:
    if op.name.startswith("rmsnorm"):
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        # in_place=False: Liger's default writes dx over dy, the shared input sets.
        return lambda x, w: LigerRMSNormFunction.apply(x, w, RMS_EPS, 0.0, "llama", False)
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    return lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, LN_EPS)


def sweep(op: Op, variants, device: str, budget: float, smoke: bool) -> None:
    measure(op, "eager (bwd only)", "baseline", graph_build(op, op.functional), budget, smoke)
    if liger_available():
        measure(op, "liger (bwd only)", "baseline", graph_build(op, liger_forward(op)), budget, smoke)
    else:
        ROWS.append(Row(op.name, "liger", "baseline", status="skipped (not importable)"))
    measure(op, "task Model eager (fwd + bwd)", "baseline", task_model_build(op, device), budget, smoke)
    measure(op, "seed default", "seed", seed_build(op, {}), budget, smoke, repeat_check=True)
    for label, options in variants:
        measure(op, label, "variant", seed_build(op, options), budget, smoke, repeat_check=True)


def main() -> int:
    ap = parser(__doc__.splitlines()[0], budget_s=70.0)
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for sweep_norm_bwd.json (default: $OUT)")
    args = ap.parse_args()
    device = device_for(args.smoke)
    if device is None:
        return 2
    env = announce(device)
    copy_gbps = copy_bandwidth(device, args.smoke)
    m, n = (24, 256) if args.smoke else (16384, 4096)
    ops = []
    for kind, variants in (("rmsnorm", RMS_VARIANTS), ("layernorm", LN_VARIANTS)):
        op = make_op(kind, m, n, device)
        sweep(op, variants, device, args.budget, args.smoke)
        ops.append(op)
    for op in ops:  # the slowest baseline (ANCHORS.md), and the longest to build: last, where the budget cuts
        measure(op, "torch.compile (bwd only)", "baseline", graph_build(op, torch.compile(op.functional)),
                args.budget, args.smoke)
    return finish(args.out, "sweep_norm_bwd.json", env, copy_gbps, START)


if __name__ == "__main__":
    sys.exit(main())
