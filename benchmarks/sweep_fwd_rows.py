"""The three forwards just short of ANCHORS.md on the H200 (RMSNorm and LayerNorm 16384x4096, RoPE B4 T4096
Hq32 Hk8 D128, bf16): each seed's default and its launch variants against the tasks' Models (eager, torch.compile,
Liger when importable) and two copies of the same bytes (the ceiling), in one run.

    python3 benchmarks/sweep_fwd_rows.py [--budget 75] [--out DIR] [--ops rmsnorm,layernorm,rope]  # H200: table last
    TRITON_INTERPRET=1 python3 benchmarks/sweep_fwd_rows.py --smoke     # CPU interpreter, tiny shapes

Liger is timed when `liger_kernel` imports (on the device machine: pip install --no-deps --target /tmp/site
.whl/liger_kernel-0.8.5-py3-none-any.whl and PYTHONPATH=/tmp/site). Not yet run on the GPU: about 28 Triton compiles,
three torch.compile graphs and three Liger kernels, estimated at 60-85 s. Each op may start rows until its share of
--budget (38%, 69%, 100%, cumulative: what one op leaves goes to the next); later rows print "skipped".

Why these variants (registers a thread from triton 3.9's ptxas for sm_90 on the CPU, with the launch's 16-byte
alignment; the GPU run prints 3.6's in each row): the seeds keep one 8 KB row in flight per program, and registers
cap the programs per SM (RMSNorm's and LayerNorm's 8-warp kernels 37-40 registers: 6 programs, 48 KB in flight per
SM; 32 registers would allow 8, the thread limit). So: a 1-D unmasked row kernel with 32-bit offsets that compiles
to 32 registers under maxnreg=32 without spilling (8 programs, 64 KB); persistent grids that load ahead, either
through registers (prefetch: the next row's load before this row's arithmetic) or through shared memory
(stages: tl.range(num_stages=) makes Triton's pipeliner issue cp.async loads stages - 1 rows ahead, so the bytes in
flight no longer cost registers: 512 programs x 3 rows is ~12 rows, ~93 KB, per SM); LayerNorm's two statistics
from one reduction (one barrier round instead of two); streaming stores; RoPE: unmasked 32-bit blocks of 1-4
tokens per program (the seed runs 9 programs of 2 warps per SM; 2 tokens at 8 warps or 4 at 16 halve or quarter
the programs) and persistent grids over 1-token blocks pipelined through shared memory.

Every implementation is first checked against float64 at the full shape (relative L2 below 1e-2 on every output);
a wrong one prints WRONG and is not timed. Times are do_bench medians (warmup 25 ms, rep 100 ms; do_bench clears
the L2 before each call) rotating over three input sets. GB/s counts the tasks' CRUCIBLE_BYTES.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # one small graph each: no compile-worker pool to start

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._bench import parser, rel_l2, rotating_median_ms  # noqa: E402
from benchmarks._rows import ROWS, Row, device_for, liger_available  # noqa: E402
from seeds import layernorm, rmsnorm, rope  # noqa: E402
from seeds._common import RowVariant  # noqa: E402

START = time.time()
SETS = 3
DT = torch.bfloat16
TOL = 1e-2  # relative L2 against float64: bf16 rounding gives 2e-3 to 3e-3
ELEM_TOL = 2e-2  # and every element: |got - truth| / (|truth| + 1), so one unwritten row cannot hide in the L2 norm


class Clock:
    """Per-op deadlines: op i may start rows until START + budget * shares[i] (cumulative; with all three ops,
    RMSNorm's share is the largest: it also pays for the first torch.compile's start-up)."""

    def __init__(self, budget: float, n_ops: int):
        self.budget, self.op = budget, -1
        self.shares = (0.38, 0.69, 1.0) if n_ops == 3 else tuple((i + 1) / n_ops for i in range(n_ops))

    def next_op(self) -> None:
        self.op += 1

    def over(self) -> bool:
        return time.time() - START > self.budget * self.shares[min(self.op, len(self.shares) - 1)]


# ---- which kernels a row compiled (registers, spills), best effort -------------------------------------------------

_SEEN: set[int] = set()


def _compiled(fns) -> list:
    out = []
    for fn in fns:
        for cache in getattr(fn, "device_caches", {}).values():
            kernels = cache[0] if isinstance(cache, tuple) else cache
            out.extend(kernels.values() if isinstance(kernels, dict) else [])
    return out


def resources_note(fns) -> str:
    """'regs R spills S shared B' of each kernel of `fns` compiled since the last call (GPU only). Shared memory
    near (stages - 1) x 8 KB per tensor says the pipeliner took the row loads; ~0 says it did not."""
    notes = []
    try:
        for k in _compiled(fns):
            if id(k) in _SEEN:
                continue
            _SEEN.add(id(k))
            if getattr(k, "n_regs", None) is None and hasattr(k, "_init_handles"):
                k._init_handles()
            if getattr(k, "n_regs", None) is not None:
                shared = getattr(getattr(k, "metadata", None), "shared", None)
                notes.append(f"regs {k.n_regs} spills {k.n_spills} shared {shared}")
    except Exception as exc:  # noqa: BLE001 - a report detail, never a reason to lose a row
        notes.append(f"(no register count: {type(exc).__name__})")
    return "; ".join(notes)


def measure(clock: Clock, op: str, impl: str, kind: str, nbytes: int,
            build: Callable[[], tuple[Callable[[int], object], list, list]], smoke: bool, jit_fns=()) -> None:
    """build() -> (fn(i) for input set i, outputs of set 0, float64 truths). Check, then time; never raises."""
    row = Row(op, impl, kind)
    ROWS.append(row)
    if clock.over():
        row.status = "skipped (budget)"
        print(f"  {op:<22} {impl:<44} skipped (budget)", flush=True)
        return
    try:
        fn, outs, truths = build_poisoned(build, smoke)
        row.rel_l2 = max(rel_l2(o, t) for o, t in zip(outs, truths))
        worst = max(elem_err(o, t) for o, t in zip(outs, truths))
        if not smoke:
            row.note = resources_note(jit_fns)
        if not (row.rel_l2 < TOL and worst < ELEM_TOL):
            row.status = "WRONG"
            row.note = f"worst element error {worst:.2e}; " + row.note
        else:
            row.ms = rotating_median_ms(fn, SETS, smoke)
            row.gbps = nbytes / row.ms / 1e6
            row.status = "ok"
    except Exception as exc:  # noqa: BLE001 - one failing implementation must not hide the others
        row.status = f"FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
    print(f"  {op:<22} {impl:<44} {row.status:<6} {row.ms or float('nan'):8.4f} ms  "
          f"{row.gbps or float('nan'):7.0f} GB/s  rel_l2 {row.rel_l2}  {row.note}  t={time.time() - START:.0f}s",
          flush=True)


def build_poisoned(build, smoke: bool):
    """build() right after NaN-filled blocks of the outputs' sizes were freed: the caching allocator hands them to
    the outputs, so rows a kernel never writes read NaN instead of an earlier implementation's right answer."""
    if not smoke:
        for nbytes in POISON_SIZES:
            torch.full((nbytes // 2,), float("nan"), dtype=DT, device="cuda")
    return build()


POISON_SIZES: list[int] = []


def elem_err(got: torch.Tensor, truth: torch.Tensor) -> float:
    err = ((got.detach().double() - truth).abs() / (truth.abs() + 1)).max()
    return float(err) if torch.isfinite(err) else float("inf")


def load_task(name: str):
    spec = importlib.util.spec_from_file_location(f"task_{name}", ROOT / "tasks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def baselines(clock: Clock, op: str, nbytes: int, task, model, sets, truth, smoke: bool,
              private_sets: Callable[[], list] | None = None) -> None:
    """The task's Model eager, torch.compile'd, and through its crucible_liger hook. `private_sets`: fresh copies
    of the input sets for Liger, which may rotate its inputs in place (RoPE)."""
    def build_for(call, sets_for_call=None):
        def build():
            s = sets_for_call() if sets_for_call else sets
            out0 = call(*[t.clone() for t in s[0]]) if sets_for_call else call(*s[0])
            out0 = list(out0) if isinstance(out0, (tuple, list)) else [out0]
            return (lambda i: call(*s[i])), out0, truth
        return build

    measure(clock, op, "eager (the task's Model)", "baseline", nbytes, build_for(model), smoke)
    if liger_available():
        measure(clock, op, "Liger (crucible_liger)", "baseline", nbytes,
                build_for(task.crucible_liger(model), private_sets), smoke)
    else:
        ROWS.append(Row(op, "Liger", "baseline", status="skipped (not importable)"))
    if smoke:
        ROWS.append(Row(op, "torch.compile", "baseline", status="skipped (smoke)"))
    else:
        measure(clock, op, "torch.compile (the task's Model)", "baseline", nbytes, build_for(torch.compile(model)),
                smoke)


# ---- the ceiling: copies of the same bytes ---------------------------------------------------------------------------

@triton.jit
def _row_copy_kernel(X, Y, N, BLOCK_N: tl.constexpr):
    # The seeds' memory pattern with no arithmetic: one unmasked row of BLOCK_N elements per program.
    offs = tl.program_id(0) * N + tl.arange(0, BLOCK_N)
    tl.store(Y + offs, tl.load(X + offs))


def row_copy(x2: torch.Tensor) -> torch.Tensor:
    m, n = x2.shape
    if n != triton.next_power_of_2(n) or not x2.is_contiguous():
        raise ValueError(f"row_copy takes contiguous rows of a power-of-two width, got {tuple(x2.shape)}")
    y = torch.empty_like(x2)
    _row_copy_kernel[(m,)](x2, y, n, BLOCK_N=n, num_warps=8)
    return y


def copies(clock: Clock, op: str, flat_sets: list[torch.Tensor], width: int, smoke: bool) -> None:
    """torch's clone and the Triton row copy of tensors of the op's size (read once, written once)."""
    nbytes = 2 * flat_sets[0].numel() * flat_sets[0].element_size()

    def build_for(call):
        def build():
            return (lambda i: call(flat_sets[i])), [call(flat_sets[0])], [flat_sets[0].double()]
        return build

    measure(clock, op, f"copy: torch clone, {nbytes >> 20} MiB moved", "copy", nbytes, build_for(torch.clone), smoke)
    measure(clock, op, f"copy: Triton one {width}-wide row per program, 8 warps", "copy", nbytes,
            build_for(lambda t: row_copy(t.view(-1, width)).view(t.shape)), smoke, jit_fns=[_row_copy_kernel])


# ---- RMSNorm --------------------------------------------------------------------------------------------------------

RMS_VARIANTS = [  # (label, RowVariant, options), in order of promise; registers from triton 3.9's ptxas (sm_90).
    # Persistent grids divide the 16384 rows evenly (512 or 1024 programs; 4 or 8 per SM would leave 16 or 32
    # programs a last row of their own) and fit on the GPU at once (the note column has each kernel's registers
    # and shared memory: stages pipeline through shared memory, 32 KB a program at 3 stages, w's loads included).
    ("row w8 maxnreg32 (8 programs/SM)", RowVariant(num_warps=8, maxnreg=32), {}),  # 32 regs, no spills
    ("persistent 512 w8 stages 3", RowVariant(num_warps=8), {"programs": 512, "stages": 3}),  # 40 regs
    ("row w8 (6 programs/SM, as the seed)", RowVariant(num_warps=8), {}),  # 38 regs
    ("persistent 512 w8 prefetch", RowVariant(num_warps=8, programs_per_sm=4, prefetch=True), {"programs": 512}),
    ("persistent 512 w8 stages 4", RowVariant(num_warps=8), {"programs": 512, "stages": 4}),  # 48 KB shared
    ("persistent 1024 w8 maxnreg32", RowVariant(num_warps=8, maxnreg=32), {"programs": 1024}),
    ("row w8 maxnreg32 .cs", RowVariant(num_warps=8, maxnreg=32, store_cache=".cs"), {}),
    ("row w8 64-bit offsets", RowVariant(num_warps=8), {"wide": True}),
    ("row w4 (8 programs/SM of 4 warps)", RowVariant(num_warps=4), {}),  # 62 regs
]


def sweep_rows(clock: Clock, op: str, nbytes: int, task, model, x_sets: list[torch.Tensor], truth: list,
               smoke: bool, seed: tuple[str, Callable, object], rows: tuple[list, Callable, object]) -> None:
    """One row-norm forward: its baselines and copies, the seed's default (seed: label, call(x), kernel), then
    each variant (rows: the variant list of (label, RowVariant, options), call(x, variant, options), kernel)."""
    POISON_SIZES[:] = [x_sets[0].numel() * x_sets[0].element_size()]  # bytes

    def ours(call):
        def build():
            return (lambda i: call(x_sets[i])), [call(x_sets[0])], truth
        return build

    baselines(clock, op, nbytes, task, model, [(x,) for x in x_sets], truth, smoke)
    copies(clock, op, x_sets, x_sets[0].shape[-1], smoke)
    label, call, kernel = seed
    measure(clock, op, label, "seed", nbytes, ours(call), smoke, [kernel])
    variants, row_call, row_kernel = rows
    for label, v, options in variants:
        measure(clock, op, label, "variant", nbytes, ours(lambda x, v=v, o=options: row_call(x, v, o)), smoke,
                [row_kernel])


def sweep_rmsnorm(clock: Clock, m: int, n: int, device: str, smoke: bool) -> None:
    task = load_task("rmsnorm_fwd")
    model = task.Model(n, task.EPS).to(device)
    w, eps = model.weight.detach(), model.eps
    x_sets = [torch.randn(m, n, device=device, dtype=DT) for _ in range(SETS)]
    truth = [F.rms_norm(x_sets[0].double(), (n,), w.double(), eps)]
    sweep_rows(clock, f"RMSNorm fwd {m}x{n}", 2 * (2 * m * n + n), task, model, x_sets, truth, smoke,
               ("seed default (2-D block, 1 row, masks, 64-bit)", lambda x: rmsnorm.rmsnorm_fwd(x, w, eps),
                rmsnorm._rmsnorm_fwd_kernel),
               (RMS_VARIANTS, lambda x, v, o: rmsnorm.rmsnorm_fwd_rows(x, w, eps, v, **o),
                rmsnorm._rmsnorm_fwd_row_kernel))


# ---- LayerNorm ------------------------------------------------------------------------------------------------------

LN_VARIANTS = [  # (label, RowVariant, options); registers from triton 3.9's ptxas (sm_90)
    ("row w8 one-pass maxnreg32 (8 programs/SM)", RowVariant(num_warps=8, maxnreg=32), {"one_pass": True}),
    ("persistent 512 w8 stages 3 one-pass", RowVariant(num_warps=8), {"one_pass": True, "programs": 512,
                                                                      "stages": 3}),  # 48 regs, 48 KB shared
    ("row w8 two-pass maxnreg32 (8 programs/SM)", RowVariant(num_warps=8, maxnreg=32), {}),  # 2 spilled values
    ("row w8 two-pass (6 programs/SM, as the seed)", RowVariant(num_warps=8), {}),  # 39 regs
    ("row w8 one-pass", RowVariant(num_warps=8), {"one_pass": True}),  # 40 regs
    ("persistent 512 w8 prefetch one-pass", RowVariant(num_warps=8, programs_per_sm=4, prefetch=True),
     {"one_pass": True, "programs": 512}),  # 48 regs
    ("persistent 512 w8 stages 3 two-pass", RowVariant(num_warps=8), {"programs": 512, "stages": 3}),
    ("row w8 one-pass maxnreg32 .cs", RowVariant(num_warps=8, maxnreg=32, store_cache=".cs"), {"one_pass": True}),
    ("row w4 two-pass (8 programs/SM of 4 warps)", RowVariant(num_warps=4), {}),  # 59 regs, no spills
]


def sweep_layernorm(clock: Clock, m: int, n: int, device: str, smoke: bool) -> None:
    task = load_task("layernorm_fwd")
    model = task.Model(n, task.EPS).to(device)
    w, b, eps = model.weight.detach(), model.bias.detach(), model.eps
    x_sets = [torch.randn(m, n, device=device, dtype=DT) for _ in range(SETS)]
    truth = [F.layer_norm(x_sets[0].double(), (n,), w.double(), b.double(), eps)]
    sweep_rows(clock, f"LayerNorm fwd {m}x{n}", 2 * (2 * m * n + 2 * n), task, model, x_sets, truth, smoke,
               ("seed default (2-D block, 1 row, two-pass)", lambda x: layernorm.layernorm_fwd(x, w, b, eps),
                layernorm._layernorm_fwd_kernel),
               (LN_VARIANTS, lambda x, v, o: layernorm.layernorm_fwd_rows(x, w, b, eps, v, **o),
                layernorm._layernorm_fwd_row_kernel))


# ---- RoPE -----------------------------------------------------------------------------------------------------------

ROPE_VARIANTS = [  # (label, rope() options); registers and shared memory from triton 3.9's ptxas (sm_90)
    ("1 token/program w2, no masks, 32-bit", {"tokens": 1, "num_warps": 2}),  # 100 regs: 9/SM, as the seed (103)
    ("persistent 512 x 1 token w4 stages 3", {"tokens": 1, "num_warps": 4, "programs": 512, "stages": 3}),
    # ^ 72 regs, 22 KB shared: ~4 programs/SM, each with 2 tokens (20 KB) loading ahead through shared memory
    ("2 tokens/program w8", {"tokens": 2, "num_warps": 8}),  # 62 regs: 4 programs/SM of 20 KB
    ("1 token/program w4", {"tokens": 1, "num_warps": 4}),  # 64 regs: 8 programs/SM
    ("persistent 512 x 1 token w8 stages 3", {"tokens": 1, "num_warps": 8, "programs": 512, "stages": 3}),
    ("4 tokens/program w16", {"tokens": 4, "num_warps": 16}),  # 62 regs: 2 programs/SM of 40 KB
    ("2 tokens/program w8 .cs", {"tokens": 2, "num_warps": 8, "store_cache": ".cs"}),
]


def sweep_rope(clock: Clock, b: int, t: int, hq: int, hk: int, d: int, device: str, smoke: bool) -> None:
    op = f"RoPE fwd B{b} T{t} Hq{hq} Hk{hk} D{d}"
    task = load_task("rope_fwd")
    nbytes = 2 * (2 * b * t * (hq + hk) * d + 2 * t * d)
    model = task.Model().to(device)
    cos, sin = (c.to(device) for c in task.rope_tables(t, d))
    sets = [(torch.randn(b, t, hq, d, device=device, dtype=DT), torch.randn(b, t, hk, d, device=device, dtype=DT),
             cos, sin) for _ in range(SETS)]
    truth = list(model(*[a.double() for a in sets[0]]))
    POISON_SIZES[:] = [2 * b * t * hq * d, 2 * b * t * hk * d]

    def private_sets():  # Liger rotates q and k in place
        return [(q.clone(), k.clone(), c, s) for q, k, c, s in sets]

    def ours(call):
        def build():
            return (lambda i: call(*sets[i])), list(call(*sets[0])), truth
        return build

    baselines(clock, op, nbytes, task, model, sets, truth, smoke, private_sets)
    total = b * t * (hq + hk) * d
    flat = [torch.randn(total, device=device, dtype=DT) for _ in range(SETS)]
    copies(clock, op, flat, min(4096, total & -total), smoke)  # rows of the widest power of two up to 4096
    del flat
    measure(clock, op, "seed default (1 token/program, w2, masks)", "seed", nbytes,
            ours(lambda q, k, c, s: rope.rope(q, k, c, s)), smoke, [rope._rope_kernel])
    for label, options in ROPE_VARIANTS:
        measure(clock, op, label, "variant", nbytes,
                ours(lambda q, k, c, s, o=options: rope.rope(q, k, c, s, **o)), smoke, [rope._rope_tokens_kernel])


# ---- table ----------------------------------------------------------------------------------------------------------

def table() -> None:
    print("\n| op | impl | ms | GB/s | % of the op's torch clone | vs best baseline | rel L2 | status |")
    print("|---|---|---|---|---|---|---|---|")
    for op in dict.fromkeys(r.op for r in ROWS):
        rows = [r for r in ROWS if r.op == op]
        base = [r for r in rows if r.kind == "baseline" and r.status == "ok"]
        best = min(base, key=lambda r: r.ms) if base else None
        clone = next((r for r in rows if r.kind == "copy" and r.status == "ok"), None)
        for r in rows:
            ms = f"{r.ms:.4f}" if r.ms else "–"
            gb = f"{r.gbps:,.0f}" if r.gbps else "–"
            pct = f"{100 * r.gbps / clone.gbps:.1f}%" if r.gbps and clone else "–"
            sp = f"{best.ms / r.ms:.3f}x" if best and r.ms and r.kind != "copy" else "–"
            err = f"{r.rel_l2:.1e}" if r.rel_l2 is not None else "–"
            status = r.status + (f"; {r.note}" if r.note else "")
            print(f"| {op} | {r.impl} | {ms} | {gb} | {pct} | {sp} | {err} | {status} |")
        if best:
            print(f"| {op} | (best baseline: {best.impl}) | | | | | | |")


def main() -> int:
    ap = parser(__doc__.splitlines()[0], budget_s=75.0)
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for sweep_fwd_rows.json (default: $OUT)")
    ap.add_argument("--ops", default="rmsnorm,layernorm,rope",
                    help="comma-separated subset of rmsnorm, layernorm, rope (default: all three)")
    args = ap.parse_args()
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    if not ops or set(ops) - {"rmsnorm", "layernorm", "rope"}:
        print(f"--ops takes a comma-separated subset of rmsnorm, layernorm, rope; got {args.ops!r}.")
        return 2
    device = device_for(args.smoke)
    if device is None:
        return 2
    torch.manual_seed(0)
    torch.set_grad_enabled(False)  # forwards only: no autograd graphs behind the baselines' parameters, and
    # torch.compile builds an inference graph (faster to compile than a joint one)
    env = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)",
           "torch": torch.__version__, "triton": triton.__version__, "liger": liger_available()}
    print(env, flush=True)
    clock = Clock(args.budget, len(ops))
    steps = {
        "rmsnorm": lambda: sweep_rmsnorm(clock, *((24, 128) if args.smoke else (16384, 4096)), device, args.smoke),
        "layernorm": lambda: sweep_layernorm(clock, *((24, 128) if args.smoke else (16384, 4096)), device,
                                             args.smoke),
        "rope": lambda: sweep_rope(clock, *((1, 8, 4, 2, 16) if args.smoke else (4, 4096, 32, 8, 128)), device,
                                   args.smoke),
    }
    for step in (steps[o] for o in ops):
        clock.next_op()
        step()
        if device == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "sweep_fwd_rows.json").write_text(
            json.dumps({"env": env, "rows": [asdict(r) for r in ROWS]}, indent=1))
    table()
    print(f"\ntotal {time.time() - START:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
