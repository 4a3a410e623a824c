"""H200 sweep of the attention fwd+bwd seed's variants, B4 H32 S4096 D128 bf16, non-causal and causal, in
ONE call, against SDPA's cuDNN (the baseline) and FlashAttention-2 backends timed in the same run.

Variants (seeds/attention.py keywords; the seed's default first, all with the `precise` numerics unless named):
- default: precise forward 128 x 64 x 8 warps x 3 stages (three products), backward 64/128 dK/dV, 128/64 dQ tiles,
  8 warps, 3 stages, dS split in both products (measured: 12.6 ms / 6.7 ms);
- control, not precise (non-causal only, to save its compiles): the faster numerics the harness rejects on these
  draws; it must read WRONG here, which shows that the check below has teeth;
- fwd ws: the precise forward warp-specialised (attention_fwd_with_delta(warp_specialize=True)): dO now comes
  through an in-kernel descriptor like Q, so the three-product loop runs as a TMA producer warp group and two
  consumer warp groups of 64 rows at 128 x 128 x 4 warps x 2 stages (213 KB of shared memory; the plain forward
  went 492 -> 536 TFLOP/s this way on the H200); not persistent, which needs 279 KB with the dO tile (sm_90 compile);
- bwd dq_atomic: dQ computed in the dK/dV kernel (FlashAttention-2's layout) and added with fp32 atomics
  (red.global.add.v4.f32), so the dQ kernel and its recompute of S = QK^T and dP = dO V^T (2 of the backward's 7
  products with the split) are not launched;
- bwd dS fp16: split_ds="fp16", dS rounded to fp16 (11 significant bits, against bf16's 8 unsplit and ~16 split)
  in ONE product per gradient, the other operand (Q or K, bf16) converted to fp16 in the kernel: the split's extra
  product (~0.9 ms each, measured) gone, if 3 more bits satisfy the bound (the check says; one draw per mode only);
- the combinations: dS fp16 with dq_atomic, and each with the ws forward.
Not a variant: tl.range(warp_specialize=True) in the backward's loops. Triton's Hopper pass asserts on both kernels
as they stand (TaskIdPropagation, checked by compiling for sm_90 on the CPU, triton 3.9): it needs one loop without
pointer loads (lse and delta are pointer loads; three loops per query head).

--schedules (a separate list, SCHEDULE_VARIANTS; the rows above are the default mode's): the backward's launch
schedule and tiles (attention_bwd's schedule= and config=) under the seed's own forward (precise, warp-specialised
128 x 128 x 4 warps x 2 stages, as ModelNew launches it), causal first (where the schedule matters most):
- bwd heavy_first (causal): the dQ kernel's query blocks launched last-first, so its longest programs (the last
  query blocks see every key) start first instead of ending the launch (dK/dV's heaviest already come first);
- bwd pairs (causal): both kernels persistent (one program per SM) over pairs of a heavy and a light block of one
  head (key blocks j and NUM_BLK - 1 - j in dK/dV, query blocks in dQ; the same work a pair), numbered head by
  head, as the forward's pairs (causal forward 450 -> 525.5 TFLOP/s);
- bwd persistent: one program per SM looping over the (block, head) tiles head by head (causal: heavy first);
  sm_90 compiles (triton 3.9 here) show 284-340 bytes of spills in the dK/dV kernel that the grid's has not;
- bwd 4 stages: 4 stages of the Q/dO (dK/dV) and K/V (dQ) tiles instead of 3 (199 / 198 KB of shared memory);
- bwd 4 warps 64 x 64 x 2 stages: half the keys (dK/dV) and queries (dQ) a program, 99 KB and <= 255 registers
  x 128 threads, so TWO programs share an SM and one's softmax may overlap the other's products (the grid's 8-warp
  programs take 255 registers x 256 threads: one an SM);
- fwd pairs, not ws (causal): the precise forward persistent over pairs at 128 x 64 x 8 warps x 3 stages (165 KB;
  the warp-specialised forward needs 279 KB persistent, and at 1 stage Triton's pass no longer splits it: a plain
  4-warp 128 x 128 kernel spilling 2.2 KB, compiled for sm_90 here, not run);
- bwd blocks_major: the grid's axes swapped, one block of every head in a row (the running programs then spread
  over every head's Q/dO: expected to lose L2 reuse, measured since it is one word);
- bwd heavy_first + 4 stages (causal): the two causal-side changes together.
Rows are timed fwd+bwd plus the part they change (the forward or the backward); the seed default all three (the
default mode's rows all three, as before).
    python3 benchmarks/sweep_attention_bwd.py --schedules [--budget 75]

Check (the same criterion as benchmarks/sweep_attention_precise.py, i.e. the harness's): each variant's (o, dq, dk,
dv) on two draws of the task's inputs per mode (MODES: cells the non-precise numerics fail) against the harness's
Reference (SDPA in bf16, its float64 truth, SDPA's FlashAttention-2 backend as the alternate),
sandbox.tolerance.compare per output; any element outside on either draw -> WRONG, not timed. A pass here is two
draws, not `crucible check` (all distributions and the robustness shapes). Timing: triton.testing.do_bench
medians over 3 rotating input sets (benchmarks/_bench.py) of fwd+bwd, the forward alone (o, lse, delta) and the
backward alone (from that forward's outputs). TFLOP/s: 14 B H S^2 D for fwd+bwd (half when causal), 4 B H S^2 D
for the forward, 10 for the backward (the convention of ANCHORS.md, not the precise path's extra products). One
table last.

    python3 benchmarks/sweep_attention_bwd.py [--budget 75]                # the H200, about 90 s with compiles
    TRITON_INTERPRET=1 python3 benchmarks/sweep_attention_bwd.py --smoke   # the CPU interpreter, tiny shape
Rows also go to $OUT/sweep_attention_bwd.json (--schedules: sweep_attention_bwd_schedules.json) when OUT is set.
Compiles (~1-3 s each, 27 kernels in --schedules) run first in --precompile (8) worker processes at once (each runs
its share of the variants once at the task's shape, which fills Triton's on-disk cache; the main process computes
the first references meanwhile and waits for them before it times anything); the rows then load the kernels from
the cache. A worker's failure only costs time: the row compiles (or fails) itself as before.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks._bench import parser, rotating_median_ms  # noqa: E402
from sandbox.reference import Reference  # noqa: E402
from sandbox.task import load_task  # noqa: E402
from sandbox.tolerance import compare  # noqa: E402
from seeds import attention as A  # noqa: E402

SETS = 3
NAMES = ("o", "dq", "dk", "dv")
# mode -> (task file, the distributions of the check's draws: cells the non-precise numerics fail (H200): non-causal
# outliers dq 138 / dk 5 and constant rows dq 2048, causal normal dq 30 / dk 21 and constant rows dq 896)
MODES = {False: ("attention_fwd_bwd", ("outliers", "constant_rows")),
         True: ("attention_fwd_bwd_causal", ("normal", "constant_rows"))}
PRECISE = dict(precise=True)
WS = dict(precise=True, warp_specialize=True, config=(128, 128, 4, 2))
SPLIT = dict(split_ds=True)
ATOMIC = dict(split_ds=True, dq_atomic=True)
FP16 = dict(split_ds="fp16")
# (name, attention_fwd_with_delta keywords, attention_bwd keywords, None: both modes, else only causal == it)
VARIANTS = [
    ("default (precise)", PRECISE, SPLIT, None),
    ("control: not precise", dict(precise=False), dict(split_ds=False), False),  # (its 3 compiles once)
    ("bwd dq_atomic", PRECISE, ATOMIC, None),
    ("bwd dS fp16", PRECISE, FP16, None),
    ("bwd dS fp16 + dq_atomic", PRECISE, dict(FP16, dq_atomic=True), None),
    # last: Triton's warp-specialisation pass is the likeliest to fail on triton 3.6 (each row is logged as it ends)
    ("fwd ws 128x128 w4 s2", WS, SPLIT, None),
    ("fwd ws + bwd dq_atomic", WS, ATOMIC, None),
    ("fwd ws + bwd dS fp16 + dq_atomic", WS, dict(FP16, dq_atomic=True), None),
]


# --schedules: the seed's forward (ModelNew: precise, warp-specialised at its default 128 x 128 x 4 x 2) and the
# backward's schedules and tiles (attention_bwd's schedule and config; its default config is 64/128 dK/dV, 128/64
# dQ tiles, 8 warps, 3 stages). In order of expected value: rows past the budget are skipped.
SEED_FWD = dict(precise=True, warp_specialize=True)


def _sched(schedule: str, config: tuple | None = None) -> dict:
    return dict(SPLIT, schedule=schedule, **({"config": config} if config else {}))


STAGES4 = (64, 128, 128, 64, 8, 4)
SCHEDULE_VARIANTS = [
    ("seed default", SEED_FWD, SPLIT, None),
    ("bwd heavy_first", SEED_FWD, _sched("heavy_first"), True),
    ("bwd pairs", SEED_FWD, _sched("pairs"), True),
    ("bwd persistent", SEED_FWD, _sched("persistent"), None),
    ("bwd 4 stages", SEED_FWD, _sched("grid", STAGES4), None),
    ("bwd 4 warps 64x64 s2 (2 an SM)", SEED_FWD, _sched("grid", (64, 64, 64, 64, 4, 2)), None),
    ("fwd pairs not ws 128x64 w8 s3", dict(precise=True, persistent=True, pairs=True, config=(128, 64, 8, 3)), SPLIT,
     True),
    ("bwd blocks_major", SEED_FWD, _sched("blocks_major"), None),
    ("bwd heavy_first + 4 stages", SEED_FWD, _sched("heavy_first", STAGES4), True),
]


def _compile_jobs(jobs: list, schedules: bool, shape: tuple, device: str = "cuda") -> None:
    """A --precompile worker: runs each (variant index, causal) of its share once on random inputs of `shape`, so
    that Triton compiles the kernels into its on-disk cache; failures are the rows' to report."""
    variants = SCHEDULE_VARIANTS if schedules else VARIANTS
    gen = torch.Generator(device=device).manual_seed(7)
    x = [torch.randn(shape, device=device, generator=gen).to(torch.bfloat16) for _ in range(4)]
    for index, causal in jobs:
        try:
            seed(*variants[index][1:3])[2](*x, causal)
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # (the row itself will say what failed)
            print(f"precompile {variants[index][0]} causal={causal}: {type(exc).__name__}", flush=True)


def start_precompile(variants: list, modes: list, schedules: bool, shape: tuple, workers: int,
                     device: str = "cuda") -> list:
    """Worker processes compiling every (variant, mode) of the run at once, a share each (see _compile_jobs)."""
    jobs = [(i, causal) for causal, _ in modes for i, (_, _, _, only) in enumerate(variants)
            if only is None or only == causal]
    workers = min(workers, len(jobs))
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_compile_jobs, args=(jobs[w::workers], schedules, shape, device), daemon=True)
             for w in range(workers)]
    for proc in procs:
        proc.start()
    return procs


def wait_precompile(procs: list, t0: float, limit_s: float) -> None:
    """Wait for the workers until limit_s seconds into the run; stop (by their handles) any still compiling."""
    for proc in procs:
        proc.join(timeout=max(0.0, limit_s - (time.time() - t0)))
    late = [proc for proc in procs if proc.is_alive()]
    for proc in late:
        proc.terminate()
    log(t0, f"precompile: {len(procs)} workers done" + (f", {len(late)} stopped at {limit_s:g} s" if late else ""))
    procs.clear()


def log(t0: float, msg: str) -> None:
    print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)


def smoke_kwargs(fwd: dict, bwd: dict) -> tuple[dict, dict]:
    """The same variant at interpreter-sized tiles (16 rows: the scaled tasks' S, so that the keys fill whole blocks
    and the warp-specialised path runs), TMA descriptors on (as on the H200; the interpreter's default is pointers,
    and the warp-specialised forward needs them)."""
    return dict(fwd, config=(16, 16, 4, 1), tma=True), dict(bwd, config=(16, 16, 16, 16, 4, 1), tma=True)


def seed(fwd_kw: dict, bwd_kw: dict):
    """(forward, backward, both) of one variant: q, k, v, do, causal -> (o, lse, delta) / (dq, dk, dv) / all four."""
    def fwd(q, k, v, do, causal):
        return A.attention_fwd_with_delta(q, k, v, do, causal, **fwd_kw)

    def bwd(q, k, v, do, causal, o, lse, delta):
        return A.attention_bwd(do, q, k, v, o, lse, causal, delta=delta, **bwd_kw)

    def both(q, k, v, do, causal):
        o, lse, delta = fwd(q, k, v, do, causal)
        return (o, *bwd(q, k, v, do, causal, o, lse, delta))
    return fwd, bwd, both


def sdpa(backend: str, smoke: bool):
    """SDPA with one backend (PyTorch's choice on the CPU): forward (o and the autograd graph), backward, both."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = [] if smoke else [{"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]]

    def fwd(q, k, v, do, causal):
        with (sdpa_kernel(chosen) if chosen else torch.enable_grad()), torch.enable_grad():
            q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
            return F.scaled_dot_product_attention(q_, k_, v_, is_causal=causal), (q_, k_, v_), None

    def bwd(q, k, v, do, causal, o, leaves, _):
        return torch.autograd.grad(o, leaves, do, retain_graph=True)

    def both(q, k, v, do, causal):
        o, leaves, _ = fwd(q, k, v, do, causal)
        return (o.detach(), *torch.autograd.grad(o, leaves, do))
    return fwd, bwd, both


def check(both, inputs, causal: bool, expected) -> dict[str, int]:
    """{output: elements outside the harness's bound (alternates counted)} for the outputs with any."""
    got = both(*inputs, causal)
    bad = {}
    for j, out in enumerate(NAMES):
        m = compare(f"output {j}", got[j], expected.ref[j], expected.truth[j], alternates=expected.alternates_for(j))
        if m is not None:
            bad[out] = m.mismatched
    return bad


def time_parts(fns, sets, causal: bool, smoke: bool, parts=("fwd", "bwd")) -> tuple:
    """(fwd+bwd, fwd, bwd) median ms (None for a part not in `parts`); the backward from forward outputs made once
    per input set."""
    fwd, bwd, both = fns
    t_both = rotating_median_ms(lambda i: both(*sets[i], causal), len(sets), smoke)
    t_fwd = rotating_median_ms(lambda i: fwd(*sets[i], causal), len(sets), smoke) if "fwd" in parts else None
    t_bwd = None
    if "bwd" in parts:
        saved = [fwd(*s, causal) for s in sets]
        t_bwd = rotating_median_ms(lambda i: bwd(*sets[i], causal, *saved[i]), len(sets), smoke)
        del saved
    return t_both, t_fwd, t_bwd


def changed_parts(fwd_kw: dict, bwd_kw: dict, variants: list) -> tuple[str, ...]:
    """The parts a variant changes against the list's first row (the default): those are the ones timed alone."""
    _, fwd0, bwd0, _ = variants[0]
    parts = tuple(p for p, kw, kw0 in (("fwd", fwd_kw, fwd0), ("bwd", bwd_kw, bwd0)) if kw != kw0)
    return parts or ("fwd", "bwd")


def main() -> int:
    ap = parser(__doc__.splitlines()[0], budget_s=75.0)
    ap.add_argument("--schedules", action="store_true",
                    help="the backward's schedules and tiles (SCHEDULE_VARIANTS), causal first, instead of VARIANTS")
    ap.add_argument("--precompile", type=int, default=8,
                    help="worker processes compiling the variants at once before the timed rows (0: none)")
    args = ap.parse_args()
    variants = SCHEDULE_VARIANTS if args.schedules else VARIANTS
    modes = sorted(MODES.items(), reverse=True) if args.schedules else list(MODES.items())
    t0 = time.time()
    smoke = args.smoke
    budget = float("inf") if smoke else args.budget  # (the interpreter's minutes are not the GPU's seconds)
    dev = "cpu" if smoke else "cuda"
    rows: list[dict] = []
    procs = []
    if not smoke and args.precompile > 0:
        consts = load_task(str(ROOT / "tasks" / f"{modes[0][1][0]}.py")).current_constants()
        shape = (consts["B"], consts["H"], consts["S"], consts["D"])
        procs = start_precompile(variants, modes, args.schedules, shape, args.precompile)
        log(t0, f"precompile: {len(procs)} workers started at {list(shape)}")
    for causal, (task_name, dists) in modes:
        tag = "causal" if causal else "non-causal"
        task = load_task(str(ROOT / "tasks" / f"{task_name}.py"))
        if smoke:
            task = task.scaled_for_cpu()
        reference = Reference(task, dev, 0)
        draws = {}  # distribution -> (inputs, what the harness expects)
        for dist in dists:
            inputs = task.make_inputs(1000, dist, dev)
            draws[dist] = (inputs, reference.run(inputs))
        b, h, s, d = inputs[0].shape
        gen = torch.Generator(device=dev).manual_seed(0)
        sets = [[torch.randn(b, h, s, d, device=dev, generator=gen).to(torch.bfloat16) for _ in range(4)]
                for _ in range(1 if smoke else SETS)]
        flops = 2 * b * h * s * s * d / (2 if causal else 1)  # one S x S x D matmul; fwd+bwd is 7 of them
        log(t0, f"{tag}: {task_name} [{b}, {h}, {s}, {d}], references ({', '.join(dists)} draws) done")
        if procs:  # nothing is timed while they compile
            wait_precompile(procs, t0, limit_s=min(45.0, budget / 2))
        entries = [(f"SDPA {bk}", sdpa(bk, smoke), True, ("fwd", "bwd")) for bk in ("cudnn", "flash")]
        for name, fwd_kw, bwd_kw, only in variants:
            if only is None or only == causal:
                kw = smoke_kwargs(fwd_kw, bwd_kw) if smoke else (fwd_kw, bwd_kw)
                parts = changed_parts(fwd_kw, bwd_kw, variants) if args.schedules else ("fwd", "bwd")
                entries.append((name, seed(*kw), False, parts))
        for name, fns, baseline, parts in entries:
            row = dict(causal=causal, variant=name, check="", ms=None, fwd_ms=None, bwd_ms=None, status="")
            if time.time() - t0 > budget and not baseline:
                row["status"] = "skipped (budget)"
                rows.append(row)
                log(t0, f"{tag} {name}: skipped (budget of {budget:g} s spent)")
                continue
            try:
                bad = {dist: check(fns[2], inputs, causal, expected) for dist, (inputs, expected) in draws.items()}
                row["check"] = " ".join(f"{dist}:" + (",".join(f"{k}={n}" for k, n in out.items()) or "ok")
                                        for dist, out in bad.items())
                if not any(bad.values()) or baseline:
                    row["ms"], row["fwd_ms"], row["bwd_ms"] = time_parts(fns, sets, causal, smoke, parts)
                    row["status"] = "baseline" if baseline else "ok"
                else:
                    row["status"] = "WRONG"
            except Exception as exc:  # one failing variant (compile error, out of resources) costs its row
                row["status"] = f"FAILED {type(exc).__name__}"
                log(t0, f"{tag} {name}: FAILED {type(exc).__name__}: {str(exc)[-300:]}")
                traceback.print_exc(limit=2)
            rows.append(row)
            log(t0, f"{tag} {name}: {row['status']} {row['check']} ms={row['ms']} fwd={row['fwd_ms']} "
                    f"bwd={row['bwd_ms']}")
            if not smoke:
                torch.cuda.empty_cache()
        for row in rows:
            if row["causal"] == causal:
                row["flops"] = flops
        del draws, inputs, sets
    if os.environ.get("OUT"):
        name = "sweep_attention_bwd_schedules.json" if args.schedules else "sweep_attention_bwd.json"
        Path(os.environ["OUT"], name).write_text(json.dumps(rows, indent=1))
    print_table(rows, smoke)
    return 0


def print_table(rows: list[dict], smoke: bool) -> None:
    shape = "SMOKE (CPU interpreter, tiny shape: not speed)" if smoke else "B4 H32 S4096 D128 bf16"
    print(f"\nattention fwd+bwd, {shape}; TFLOP/s by the 14 / 4 / 10 B H S^2 D convention (half causal); "
          "speedup against SDPA cuDNN fwd+bwd")
    print(f"{'mode':6s} {'variant':34s} {'fwd+bwd':>8s} {'TFLOP/s':>7s} {'vs cuDNN':>8s} {'fwd ms':>7s} {'TF/s':>5s}"
          f" {'bwd ms':>7s} {'TF/s':>5s}  status  check (elements outside the bound)")
    for causal in (False, True):
        mode = [r for r in rows if r["causal"] == causal]
        cudnn = next((r["ms"] for r in mode if r["variant"] == "SDPA cudnn" and r["ms"]), None)
        for r in mode:
            def num(x, fmt):
                return format(x, fmt) if x else "-"
            unit = r.get("flops", 0.0)
            tf = 7 * unit / r["ms"] / 1e9 if r["ms"] else None
            tf_f = 2 * unit / r["fwd_ms"] / 1e9 if r["fwd_ms"] else None
            tf_b = 5 * unit / r["bwd_ms"] / 1e9 if r["bwd_ms"] else None
            vs = f"{cudnn / r['ms']:.3f}x" if r["ms"] and cudnn else "-"
            print(f"{'causal' if causal else 'full':6s} {r['variant']:34s} {num(r['ms'], '.3f'):>8s} "
                  f"{num(tf, '.1f'):>7s} {vs:>8s} {num(r['fwd_ms'], '.3f'):>7s} {num(tf_f, '.0f'):>5s} "
                  f"{num(r['bwd_ms'], '.3f'):>7s} {num(tf_b, '.0f'):>5s}  {r['status']}  {r['check']}")


if __name__ == "__main__":
    sys.exit(main())
