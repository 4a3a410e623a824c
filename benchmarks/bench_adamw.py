"""H200 check and timing of the fused AdamW seed (seeds/adamw.py): how the launch learns where the tensors are.

The kernel was measured before (1B params: 7.134 ms, 99% of copy, 1.13x torch fused=True; docs/bench-adamw.md). What
decides the task's own shape (22.5M params in 4 tensors, new outputs every call) is the host work around the launch:
do_bench 0.317 ms against torch.compile's 0.300, and under `crucible bench` 0.570 against 0.175 (0.33x), because the
per-call table is copied to the device from pageable memory, and CUDA makes such a copy wait for the stream's earlier
work (crucible's 0.5 ms of flush passes), after which the device waits for the host's launch. Variants (adamw_step
keywords): table="auto" (the default: "args" for <= 8 tensors, every tensor's pointers and size as
launch arguments, no table, no host-to-device copy), the table from pageable memory (the former default), the
table from pinned memory (the copy is queued), per-tensor launches on the lean host path (no table either), the
first host path (host="loops") and a plan built once (no per-call host work: the floor).

1. Checks, relative L2 against float64 (the task's Model in double) next to eager fp32's own error, for every
   variant: the task's shapes, 8 tensors of odd sizes (the most the "args" form takes), 64 tensors of odd sizes
   (where the default is the pageable table), bf16 grads. A failing variant is WRONG, never timed; exit 1.
2. The task's forward (new outputs), per variant: torch ops and host-to-device copies per call (counted), host
   microseconds per call (time.perf_counter around the launcher, the device synchronised every 20 calls so the
   launch queue never fills), the device time per call of 50 calls back to back (no flush: a host-bound call shows
   its host time), do_bench over 3 rotating input sets, and crucible's timer imitated: 30 calls, each after a device
   sync and ~0.5 ms of flush passes (zero_ of a 256 MiB buffer, as many passes as cover 0.5 ms), CUDA events around
   the call, median; the host time of the call is kept too (a pageable copy shows the flush's wait there). Eager
   Model and torch.compile(Model) the same ways (compile skipped when under 25 s of the budget is left).
3. ANCHORS, 1B fp32 params in 64 tensors of 15,625,000, in place: the default (the pageable table at 64 tensors), the pinned table,
   plan once, torch fused=True, fused + a bf16 copy. 4. A Llama-3.2-1B-like mix (146 tensors): default, pinned,
   fused=True. Each skips when its share of the budget is spent.
Bytes: the seed moves 30 B/param (read p, g, m, v; write p, m, v, bf16 p); torch fused=True 28; fused + copy 34.

    python3 benchmarks/bench_adamw.py [--budget 60]          # on the GPU machine; JSON to $OUT/bench_adamw.json
    TRITON_INTERPRET=1 python3 benchmarks/bench_adamw.py --smoke   # CPU interpreter, tiny shapes: the script only
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from _bench import parser, rel_l2, rotating_median_ms  # noqa: E402
from sandbox.task import load_task  # noqa: E402
from seeds.adamw import ARGS_MAX_TENSORS, ModelNew, adamw_step, plan_adamw, run_plan  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
COPY_GBPS = 4244.0
SETS = 3
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1  # the task's get_init_inputs
STEP = 10.0
ANCHOR = (3, 1001) if SMOKE else (64, 1_000_000_000 // 64)
ODD_CHECK = (64, 60 if SMOKE else 100_000)  # 64 tensors of random sizes up to this
# The bf16 copy rounds to nearest on the GPU, as eager does; the interpreter truncates (twice the RMS error).
BF16_SLACK = 2.5 if SMOKE else 1.5
T0 = time.time()
ROWS: list[dict] = []
CHECKS: list[dict] = []
HOST: list[dict] = []    # per variant on the task's shapes: torch ops and copies per call, host us, device ms
FLUSH_COVER_MS = 0.5     # crucible's timer queues this much flush work ahead of each timed call
WRONG: set[str] = set()


def llama_1b_shapes(h=2048, f=8192, kv=512, layers=16, vocab=128256) -> list[tuple[int, ...]]:
    layer = [(h, h), (kv, h), (kv, h), (h, h), (f, h), (f, h), (h, f), (h,), (h,)]
    return [(vocab, h)] + layer * layers + [(h,)]


MIX = llama_1b_shapes(16, 48, 8, 1, 100) if SMOKE else llama_1b_shapes()


VARIANTS = {  # name: adamw_step knobs; the per-element code (1024 elements / 4 warps / 1 block per chunk) is the same
    "default (auto: args <= 8 tensors, else pageable table)": {},
    "table pageable (the default until run O)": {"table": "pageable"},
    "table pinned": {"table": "pinned"},
    "per tensor, lean host": {"multi_tensor": False},
    "first host path (loops, pageable)": {"host": "loops"},
    "default, plan built once": {"plan": True},
}
DEFAULT = next(iter(VARIANTS))


def variants(*names: str) -> list[tuple[str, dict]]:
    """(name, knobs) of the named variants, all of them when none is named. "args" (the default's form at <= 8
    tensors) takes at most ARGS_MAX_TENSORS tensors; beyond them the default is the pageable table."""
    return [(k, v) for k, v in VARIANTS.items() if not names or k in names]


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def left(budget: float) -> float:
    return budget - (time.time() - T0)


def timed(op: str, impl: str, nbytes: float, fn, baseline: bool = False, extra: dict | None = None) -> None:
    try:
        ms = rotating_median_ms(fn, SETS, SMOKE)
    except Exception as exc:  # a baseline this torch lacks, a config that does not fit: say so, go on
        log(f"{op} | {impl}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
        ms = float("nan")
    row = {"op": op, "impl": impl, "ms": ms, "gbps": nbytes / ms / 1e6, "baseline": baseline, **(extra or {})}
    row["pct_copy"] = 100 * row["gbps"] / COPY_GBPS
    ROWS.append(row)
    log(f"{op} | {impl}: {ms:.3f} ms, {row['gbps']:.0f} GB/s ({row['pct_copy']:.1f}% copy)")


# ---- checks -----------------------------------------------------------------------------------------------------
def _cat(ts) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ts])


def check_all() -> None:
    """Not budgeted: an unchecked variant is never timed, and the checks cost little beyond the compiles that the
    timing would pay anyway."""
    task = load_task(ROOT / "tasks/adamw.py")
    if SMOKE:
        task = task.with_constants({"N0": 5000, "N1": 300, "N2": 17})
    model = task.make_reference(0, DEV)
    sets = {"task shapes": task.make_inputs(0, "normal", DEV)}
    g = torch.Generator().manual_seed(1)
    for count in (ARGS_MAX_TENSORS, ODD_CHECK[0]):
        sizes = torch.randint(1, ODD_CHECK[1], (count,), generator=g).tolist()
        odd = [torch.randn(s, generator=g) * 0.02 for s in sizes] + [torch.randn(s, generator=g) * 1e-3 for s in sizes]
        odd += [torch.randn(s, generator=g) * 1e-4 for s in sizes] + [torch.rand(s, generator=g) * 1e-6 for s in sizes]
        sets[f"{count} odd tensors"] = [t.to(DEV) for t in odd] + [torch.tensor(STEP, device=DEV)]
    sets["64 odd tensors, bf16 grads"] = [t.to(torch.bfloat16) if len(sizes) <= i < 2 * len(sizes) else t
                                         for i, t in enumerate(sets["64 odd tensors"])]
    sets["task shapes, bf16 grads"] = [t.to(torch.bfloat16) if 4 <= i < 8 else t
                                       for i, t in enumerate(sets["task shapes"])]
    names = ("param", "exp_avg", "exp_avg_sq", "bf16 param")
    for set_name, inputs in sets.items():
        n = (len(inputs) - 1) // 4
        eager = model(*inputs)
        truth = [t.cpu() for t in model.double()(*[x.double() for x in inputs])]
        model.float()
        # The bf16 copy is held to the float64 param (not to its bf16 rounding, which eager matches exactly).
        truth = truth[:3 * n] + truth[:n]
        eager_err = [rel_l2(_cat(eager[k * n:(k + 1) * n]).cpu(), _cat(truth[k * n:(k + 1) * n])) for k in range(4)]
        cases = variants()
        if "bf16" in set_name:
            cases = variants(DEFAULT, "table pageable (the default until run O)", "per tensor, lean host")
        for vname, knobs in cases:
            p, gr, m, v = (list(inputs[k * n:(k + 1) * n]) for k in range(4))
            if knobs.get("plan"):
                outs = run_plan(plan_adamw(p, gr, m, v, inplace=False), inputs[-1], LR, BETAS, EPS, WD)
            else:
                outs = adamw_step(p, gr, m, v, inputs[-1], LR, BETAS, EPS, WD, inplace=False, **knobs)
            for k, name in enumerate(names):
                err = rel_l2(_cat(outs[k]).cpu(), _cat(truth[k * n:(k + 1) * n]))
                ok = err <= max((BF16_SLACK if k == 3 else 4) * eager_err[k], 1e-6)
                CHECKS.append({"set": set_name, "variant": vname, "output": name, "seed": err,
                               "eager": eager_err[k], "ok": ok})
                if not ok:
                    WRONG.add(vname)
                    log(f"FAIL {set_name} | {vname} | {name}: rel L2 {err:.3g} (eager {eager_err[k]:.3g})")
        log(f"checked {len(cases)} variants on {set_name}")


# ---- timing -----------------------------------------------------------------------------------------------------
def torch_state(shapes, seed: int):
    """Params with grads under torch fused=True (state initialised by one step), its moments, a bf16 buffer."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, device=DEV, generator=g) * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, device=DEV, generator=g) * 1e-3
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)
    opt.step()
    m = [opt.state[p]["exp_avg"] for p in params]
    v = [opt.state[p]["exp_avg_sq"] for p in params]
    p16 = [torch.empty(s, dtype=torch.bfloat16, device=DEV) for s in shapes]
    return dict(params=params, data=[p.detach() for p in params], grads=[p.grad for p in params], m=m, v=v,
                p16=p16, opt=opt)


def time_config(op: str, shapes, cases, budget: float, foreach: bool) -> None:
    total = sum(torch.Size(s).numel() for s in shapes)
    if left(budget) < 8:  # three sets of torch state and the fused=True baseline take seconds at 1B params
        log(f"{op}: skipped (budget spent)")
        return
    sets = [torch_state(shapes, 100 + i) for i in range(SETS)]
    step = torch.tensor(STEP, device=DEV)
    for vname, knobs in cases:
        if vname in WRONG:
            log(f"{op} | {vname}: not timed (failed its check)")
            continue
        if left(budget) < 0:
            log(f"{op} | {vname}: skipped (section budget spent)")
            continue
        if knobs.get("plan"):
            plans = [plan_adamw(s["data"], s["grads"], s["m"], s["v"], out16=s["p16"]) for s in sets]
            timed(op, f"seed {vname}", 30 * total, lambda i: run_plan(plans[i], step, LR, BETAS, EPS, WD))
            continue

        def seed(i, k=knobs):
            s = sets[i]
            return adamw_step(s["data"], s["grads"], s["m"], s["v"], step, LR, BETAS, EPS, WD, out16=s["p16"], **k)
        timed(op, f"seed {vname}", 30 * total, seed)
    timed(op, "torch AdamW fused=True (28 B/param)", 28 * total, lambda i: sets[i]["opt"].step(), baseline=True)

    def fused_copy(i):
        sets[i]["opt"].step()
        torch._foreach_copy_(sets[i]["p16"], sets[i]["data"])
    if left(budget) > 0:
        timed(op, "torch fused=True + bf16 _foreach_copy_ (34 B/param)", 34 * total, fused_copy, baseline=True)
    if foreach and left(budget) > 0:
        opts = [torch.optim.AdamW(s["params"], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=True)
                for s in sets]
        for o in opts:
            o.step()
        timed(op, "torch AdamW foreach=True (28 B/param)", 28 * total, lambda i: opts[i].step(), baseline=True)
        del opts
    del sets


def copy_bandwidth() -> None:
    n = 1 << (12 if SMOKE else 30)
    srcs = [torch.empty(n, dtype=torch.uint8, device=DEV).random_(0, 255) for _ in range(SETS)]
    dsts = [torch.empty_like(s) for s in srcs]
    timed("copy 1 GiB", "torch copy_", 2 * n, lambda i: dsts[i].copy_(srcs[i]), baseline=True)


def _sync() -> None:
    if not SMOKE:
        torch.cuda.synchronize()


class _CountOps(TorchDispatchMode):
    """Torch ops of a call, and its host-to-device copies (a CPU tensor copied to or into a CUDA one)."""

    def __init__(self):
        super().__init__()
        self.n = 0
        self.h2d = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in ("_to_copy", "copy_", "to"):
            srcs = [a for a in args if isinstance(a, torch.Tensor)]
            dst = out if isinstance(out, torch.Tensor) else None
            if dst is not None and any(t.device.type == "cpu" for t in srcs) and dst.device.type != "cpu":
                self.h2d += 1
        return out


def host_us(fn, blocks: int = 2 if SMOKE else 10, per_block: int = 2 if SMOKE else 20) -> float:
    """Median host microseconds per call of fn(i) (rotating sets); the device is synchronised between blocks so
    the launch queue never fills (a full queue would make the host wait for the device)."""
    times, i = [], 0
    for _ in range(blocks):
        _sync()
        t0 = time.perf_counter()
        for _ in range(per_block):
            fn(i % SETS)
            i += 1
        times.append((time.perf_counter() - t0) / per_block)
    _sync()
    return 1e6 * sorted(times)[len(times) // 2]


def back_to_back_ms(fn, calls: int = 3 if SMOKE else 50) -> float:
    """Device ms per call of `calls` calls queued back to back with no flush between them: a call whose host work
    outlasts its device work shows its host time here."""
    for i in range(SETS):
        fn(i % SETS)
    if SMOKE:
        t0 = time.perf_counter()
        for i in range(calls):
            fn(i % SETS)
        return (time.perf_counter() - t0) * 1e3 / calls
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    _sync()
    start.record()
    for i in range(calls):
        fn(i % SETS)
    end.record()
    _sync()
    return start.elapsed_time(end) / calls


def _flush_passes(flush: torch.Tensor) -> int:
    """How many zero_ passes of the flush buffer cover FLUSH_COVER_MS of device time (as crucible's timer sizes it)."""
    if SMOKE:
        return 1
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(4):
        _sync()
        start.record()
        flush.zero_()
        end.record()
        _sync()
        times.append(start.elapsed_time(end))
    pass_ms = sorted(times[1:])[1]
    return max(1, -(-FLUSH_COVER_MS // pass_ms)) if pass_ms > 0 else 1


def crucible_like(fn, flush: torch.Tensor, passes: int, calls: int = 3 if SMOKE else 30) -> tuple[float, float]:
    """Median (device ms, host ms) of `calls` calls timed as crucible's timer does: a device sync, flush passes
    queued, then CUDA events around the call (the host goes on while the flush runs, unless the call waits for the
    stream, as a pageable copy does). The host ms is perf_counter around the call."""
    for i in range(SETS):
        fn(i % SETS)
    dev, host = [], []
    start, end = ((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if not SMOKE
                  else (None, None))
    for i in range(calls):
        _sync()
        for _ in range(int(passes)):
            flush.zero_()
        t0 = time.perf_counter()
        if not SMOKE:
            start.record()
        fn(i % SETS)
        th = time.perf_counter()
        if not SMOKE:
            end.record()
        _sync()
        host.append((th - t0) * 1e3)
        dev.append(start.elapsed_time(end) if not SMOKE else host[-1])
    return sorted(dev)[len(dev) // 2], sorted(host)[len(host) // 2]


def task_shapes(budget: float) -> None:
    """The task's forward (new outputs every call, as the harness calls it), per variant: host cost and device
    time four ways (host us, back to back, do_bench, crucible's timer imitated); eager and torch.compile alike."""
    task = load_task(ROOT / "tasks/adamw.py")
    if SMOKE:
        task = task.with_constants({"N0": 5000, "N1": 300, "N2": 17})
    c = task.current_constants()
    total = c["N0"] + c["N1"] + c["N2"] + c["N3"]
    op = f"task {total / 1e6:.1f}M, new outputs"
    model = task.make_reference(0, DEV)
    new = ModelNew(*task.init_inputs())
    sets = [task.make_inputs(i, "normal", DEV) for i in range(SETS)]
    n = (len(sets[0]) - 1) // 4
    lr, b1, b2, eps, wd = task.init_inputs()
    flush = torch.empty((256 << 20) // 4 if not SMOKE else 1024, dtype=torch.int32, device=DEV)
    passes = _flush_passes(flush)
    log(f"{op}: {passes} flush passes of 256 MiB cover {FLUSH_COVER_MS} ms")

    def seed(knobs):
        if knobs.get("plan"):  # built once per input set, outside the timing: the floor without host work
            plans = [plan_adamw(x[:n], x[n:2 * n], x[2 * n:3 * n], x[3 * n:4 * n], inplace=False) for x in sets]
            return lambda i: run_plan(plans[i], sets[i][-1], lr, (b1, b2), eps, wd)
        if not knobs:
            return lambda i: new(*sets[i])  # the default is ModelNew itself, as the harness calls it

        def call(i, k=knobs):
            x = sets[i]
            return adamw_step(x[:n], x[n:2 * n], x[2 * n:3 * n], x[3 * n:4 * n], x[-1], lr, (b1, b2), eps, wd,
                              inplace=False, **k)
        return call

    def measure(name: str, fn, baseline: bool) -> None:
        fn(0)  # compile outside the timings
        _sync()
        row = {"variant": name, "torch_ops": None, "h2d_copies": None, "baseline": baseline}
        if not baseline:  # not under torch.compile: a dispatch mode would change what it runs
            with _CountOps() as mode:
                fn(0)
            _sync()
            row["torch_ops"], row["h2d_copies"] = mode.n, mode.h2d
        row["call_us"] = host_us(fn)
        row["back_to_back_ms"] = back_to_back_ms(fn)
        row["crucible_ms"], row["crucible_host_ms"] = crucible_like(fn, flush, passes)
        HOST.append(row)
        log(f"{op} | {name}: {row}")
        timed(op, name if baseline else f"seed {name}", 30 * total, fn, baseline=baseline)

    for vname, knobs in variants():
        if vname in WRONG:
            log(f"{op} | {vname}: not timed (failed its check)")
            continue
        try:
            measure(vname, seed(knobs), False)
        except Exception as exc:  # a variant that fails to compile or launch: one line, go on
            log(f"{op} | {vname}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    measure("eager task Model", lambda i: model(*sets[i]), True)
    if SMOKE or left(budget) < 25:
        log(f"{op} | torch.compile: skipped ({'smoke' if SMOKE else 'budget spent'})")
    else:
        try:
            compiled = torch.compile(model)
            compiled(*sets[0])
            measure("torch.compile(task Model)", lambda i: compiled(*sets[i]), True)
        except Exception as exc:  # a compile failure is a missing baseline, not a broken benchmark
            log(f"{op} | torch.compile failed: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else ''}")
    del flush


def table() -> None:
    print("\nchecks (relative L2 vs float64; worst output per set and variant):")
    worst: dict[tuple[str, str], dict] = {}
    for ch in CHECKS:
        key = (ch["set"], ch["variant"])
        ratio = ch["seed"] / max(ch["eager"], 1e-30)
        if key not in worst or ratio > worst[key]["seed"] / max(worst[key]["eager"], 1e-30):
            worst[key] = ch
    for (s, vname), ch in worst.items():
        bad = [c["output"] for c in CHECKS if (c["set"], c["variant"]) == (s, vname) and not c["ok"]]
        print(f"  {s:<27} {vname[:52]:<52} {ch['output']:<11} seed {ch['seed']:.2e} eager {ch['eager']:.2e} "
              f"{'ok' if not bad else 'FAIL ' + ','.join(bad)}")
    if HOST:
        ref = [h["crucible_ms"] for h in HOST if h["variant"].startswith("torch.compile")]
        ref_name = "compile" if ref else "eager"
        ref = ref or [h["crucible_ms"] for h in HOST if h["variant"].startswith("eager")]
        print("\nthe task's forward (new outputs) per call: torch ops and host-to-device copies (counted), host us"
              " (perf_counter), device ms of 50 calls back to back,\ncrucible's timer imitated (sync, "
              f"{FLUSH_COVER_MS} ms of flush, events around the call; median of 30): device ms, the call's host ms, "
              f"speedup vs {ref_name} there")
        print(f"{'variant':<56} {'ops':>4} {'H2D':>4} {'host us':>8} {'b2b ms':>7} {'crucible ms':>12} "
              f"{'host ms':>8} {'speedup':>8}")
        for h in HOST:
            ops = "-" if h["torch_ops"] is None else str(h["torch_ops"])
            h2d = "-" if h["h2d_copies"] is None else str(h["h2d_copies"])
            wrong = " WRONG" if h["variant"] in WRONG else ""
            print(f"{h['variant'][:56]:<56} {ops:>4} {h2d:>4} {h['call_us']:8.1f} {h['back_to_back_ms']:7.3f} "
                  f"{h['crucible_ms']:12.3f} {h['crucible_host_ms']:8.3f} "
                  f"{(ref[0] / h['crucible_ms']) if ref else float('nan'):7.2f}x{wrong}")
    print("\nspeedup: torch fused=True's time over the row's where the op has that row, else the best baseline's")
    print(f"{'op':<30} {'variant':<60} {'ms':>8} {'GB/s':>7} {'% copy':>7} {'speedup':>8} {'max rel L2':>11}")
    for op in dict.fromkeys(r["op"] for r in ROWS):
        rows = [r for r in ROWS if r["op"] == op]
        fused = [r["ms"] for r in rows if r["impl"].startswith("torch AdamW fused=True")]
        base = [r["ms"] for r in rows if r["baseline"] and r["ms"] == r["ms"]]
        ref = fused[0] if fused else min(base, default=float("nan"))
        for r in rows:
            vname = r["impl"].removeprefix("seed ")
            errs = [c["seed"] for c in CHECKS if c["variant"] == vname and c["output"] != "bf16 param"]
            err = f"{max(errs):.2e}" if errs and r["impl"].startswith("seed ") else "-"
            print(f"{op[:30]:<30} {r['impl'][:60]:<60} {r['ms']:8.3f} {r['gbps']:7.0f} {r['pct_copy']:6.1f}% "
                  f"{ref / r['ms']:7.2f}x {err:>11}")
    env = "SMOKE (CPU interpreter: times mean nothing)" if SMOKE else torch.cuda.get_device_name()
    print(f"\n{env}, torch {torch.__version__}, triton {triton.__version__}, {time.time() - T0:.0f} s; "
          f"{len(WRONG)} variant(s) failed their checks{': ' + ', '.join(sorted(WRONG)) if WRONG else ''}")


def main() -> int:
    args = parser(__doc__.splitlines()[0], 60.0).parse_args()
    b = args.budget
    anchor_shapes = [(ANCHOR[1],)] * ANCHOR[0]
    parts = [
        ("checks", check_all),
        ("task shapes", lambda: task_shapes(b)),
        ("copy", copy_bandwidth),
        ("anchors", lambda: time_config(f"{ANCHOR[0]} x {ANCHOR[1]:,} in place", anchor_shapes,
                                        variants(DEFAULT, "table pinned", "default, plan built once"),
                                        0.8 * b, foreach=False)),
        ("llama mix", lambda: time_config(f"Llama-1B mix {len(MIX)} in place", MIX, variants(DEFAULT, "table pinned"),
                                          0.95 * b, foreach=False)),
    ]
    for name, part in parts:
        log(f"--- {name}")
        try:
            part()
        except Exception:  # one broken part must not lose the others' numbers
            log(traceback.format_exc())
        if not SMOKE:
            torch.cuda.empty_cache()
    table()
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "bench_adamw.json"
        out.write_text(json.dumps({"rows": ROWS, "checks": CHECKS, "wrong": sorted(WRONG), "task": HOST,
                                   "torch": torch.__version__, "triton": triton.__version__}, indent=1))
    return 1 if WRONG else 0


if __name__ == "__main__":
    sys.exit(main())
