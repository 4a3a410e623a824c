"""H200 check and timing of the fused AdamW seed (seeds/adamw.py): the lean per-call host path against the first one.

The kernel was measured before (1B params: 7.134 ms, 99% of copy, 1.13x torch fused=True; docs/bench-adamw.md). What
is new is the host work around its one launch, which decides the task's own shape (22.5M params, new outputs every
call: 0.38x torch.compile under `crucible bench`, host-bound). Variants: the default (host="lean"), the first host
path (host="loops", the measured default), and a plan built once (no per-call host work: the floor).

1. Checks, relative L2 against float64 (the task's Model in double) next to eager fp32's own error, for every
   variant: the task's shapes, 64 tensors of odd sizes, bf16 grads. A failing variant is WRONG, never timed; exit 1.
2. Host cost per call of the task's forward (new outputs), lean vs loops: torch ops and Python calls to build the
   plan (counted), host microseconds to build the plan alone and for the whole call with its launch
   (time.perf_counter, the device synchronised every 20 calls so the launch queue never fills), and the device
   time per call of 50 calls back to back (no flush between them: what a host-bound call costs).
3. The task's shapes under do_bench over 3 rotating input sets: ModelNew (lean), the loops path, eager Model,
   torch.compile(Model) (skipped when under 25 s of the budget is left; a compile failure is one line).
4. ANCHORS, 1B fp32 params in 64 tensors of 15,625,000, in place: lean, loops, plan once, torch fused=True, fused +
   a bf16 copy. 5. A Llama-3.2-1B-like mix (146 tensors): lean, loops, fused=True. Each skips when its share of the
   budget is spent.
Bytes: the seed moves 30 B/param (read p, g, m, v; write p, m, v, bf16 p); torch fused=True 28; fused + copy 34.

    python3 benchmarks/bench_adamw.py [--budget 60]          # on the GPU machine; JSON to $OUT/bench_adamw.json
    TRITON_INTERPRET=1 python3 benchmarks/bench_adamw.py --smoke   # CPU interpreter, tiny shapes: the script only
"""
from __future__ import annotations

import argparse
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

from _bench import rel_l2, rotating_median_ms  # noqa: E402
from sandbox.task import load_task  # noqa: E402
from seeds.adamw import ModelNew, adamw_step, plan_adamw, run_plan  # noqa: E402

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
HOST: list[dict] = []    # per host path: torch ops / Python calls to build the plan, host us, back-to-back ms
BACK: dict[str, float] = {}  # back-to-back device ms per call on the task's shapes
WRONG: set[str] = set()


def llama_1b_shapes(h=2048, f=8192, kv=512, layers=16, vocab=128256) -> list[tuple[int, ...]]:
    layer = [(h, h), (kv, h), (kv, h), (h, h), (f, h), (f, h), (h, f), (h,), (h,)]
    return [(vocab, h)] + layer * layers + [(h,)]


MIX = llama_1b_shapes(16, 48, 8, 1, 100) if SMOKE else llama_1b_shapes()


def variants() -> list[tuple[str, dict]]:
    """(name, adamw_step knobs). The default first; the kernel (1024 elements / 4 warps / 1 block per chunk) is the
    same in all three, only the host work around the launch differs."""
    return [("default (lean host)", {}), ("first host path (loops)", {"host": "loops"}),
            ("default, plan built once", {"plan": True})]


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
    sizes = torch.randint(1, ODD_CHECK[1], (ODD_CHECK[0],), generator=g).tolist()
    odd = [torch.randn(s, generator=g) * 0.02 for s in sizes] + [torch.randn(s, generator=g) * 1e-3 for s in sizes]
    odd += [torch.randn(s, generator=g) * 1e-4 for s in sizes] + [torch.rand(s, generator=g) * 1e-6 for s in sizes]
    sets["64 odd tensors"] = [t.to(DEV) for t in odd] + [torch.tensor(STEP, device=DEV)]
    sets["64 odd tensors, bf16 grads"] = [t.to(torch.bfloat16) if len(sizes) <= i < 2 * len(sizes) else t
                                         for i, t in enumerate(sets["64 odd tensors"])]
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
            cases = cases[:1]
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
    if left(budget) < 5:
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
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _python_calls(fn) -> int:
    calls = [0]

    def prof(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls[0]


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


def task_shapes(budget: float) -> None:
    """The task's forward (new outputs every call, as the harness calls it): host cost and device time."""
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

    def seed(host):
        def call(i):
            x = sets[i]
            return adamw_step(x[:n], x[n:2 * n], x[2 * n:3 * n], x[3 * n:4 * n], x[-1], lr, (b1, b2), eps, wd,
                              inplace=False, host=host)
        return call

    def plan_only(host):
        def call(i):
            x = sets[i]
            return plan_adamw(x[:n], x[n:2 * n], x[2 * n:3 * n], x[3 * n:4 * n], inplace=False, host=host)
        return call

    for host in ("lean", "loops"):
        seed(host)(0)  # compile outside the timings
        with _CountOps() as mode:
            plan_only(host)(0)
        calls = _python_calls(lambda: plan_only(host)(0))
        HOST.append({"host": host, "torch_ops_plan": mode.n, "python_calls_plan": calls,
                     "plan_us": host_us(plan_only(host)), "call_us": host_us(seed(host)),
                     "back_to_back_ms": back_to_back_ms(seed(host))})
        log(f"{op} | host={host}: {HOST[-1]}")
    back = {"seed lean": HOST[0]["back_to_back_ms"], "seed loops": HOST[1]["back_to_back_ms"]}
    timed(op, "seed default (lean host)", 30 * total, lambda i: new(*sets[i]))  # ModelNew
    timed(op, "seed first host path (loops)", 30 * total, seed("loops"))
    timed(op, "eager task Model", 30 * total, lambda i: model(*sets[i]), baseline=True)
    if SMOKE or left(budget) < 25:
        log(f"{op} | torch.compile: skipped ({'smoke' if SMOKE else 'budget spent'})")
    else:
        try:
            compiled = torch.compile(model)
            compiled(*sets[0])
            timed(op, "torch.compile(task Model)", 30 * total, lambda i: compiled(*sets[i]), baseline=True)
            back["torch.compile"] = back_to_back_ms(lambda i: compiled(*sets[i]))
        except Exception as exc:  # a compile failure is a missing baseline, not a broken benchmark
            log(f"{op} | torch.compile failed: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else ''}")
    back["eager"] = back_to_back_ms(lambda i: model(*sets[i]))
    BACK.update(back)


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
        print("\nhost work per call of the task's forward (new outputs), the same kernel:")
        print(f"{'host path':<10} {'torch ops (plan)':>17} {'Python calls (plan)':>20} {'plan us':>8} "
              f"{'call us':>8} {'back-to-back ms':>16}")
        for h in HOST:
            print(f"{h['host']:<10} {h['torch_ops_plan']:>17} {h['python_calls_plan']:>20} {h['plan_us']:8.1f} "
                  f"{h['call_us']:8.1f} {h['back_to_back_ms']:16.3f}")
        print("back to back, device ms per call (50 calls, no flush): " +
              ", ".join(f"{k} {v:.3f}" for k, v in BACK.items()))
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes (checks the script)")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds for the whole script (default 60)")
    args = parser.parse_args()
    b = args.budget
    anchor_shapes = [(ANCHOR[1],)] * ANCHOR[0]
    parts = [
        ("checks", check_all),
        ("task shapes", lambda: task_shapes(b)),
        ("copy", copy_bandwidth),
        ("anchors", lambda: time_config(f"{ANCHOR[0]} x {ANCHOR[1]:,} in place", anchor_shapes, variants(),
                                        0.8 * b, foreach=False)),
        ("llama mix", lambda: time_config(f"Llama-1B mix {len(MIX)} in place", MIX, variants()[:2], 0.95 * b,
                                          foreach=False)),
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
        out.write_text(json.dumps({"rows": ROWS, "checks": CHECKS, "wrong": sorted(WRONG), "host": HOST,
                                   "back_to_back_ms": BACK,
                                   "torch": torch.__version__, "triton": triton.__version__}, indent=1))
    return 1 if WRONG else 0


if __name__ == "__main__":
    sys.exit(main())
