"""H200 benchmark of the "mix" seeds: SwiGLU/GeGLU, RoPE, cross-entropy, fused linear + cross-entropy, AdamW.

For each op at the ANCHORS shape: check the seed against a float64 reference on the GPU (relative L2, next to the
eager bf16 op's own error), then time the seed's variants, eager PyTorch (the task's Model), torch.compile and
Liger Kernel 0.8.5 with triton.testing.do_bench(warmup=25, rep=100, return_mode="median"), rotating over 3 input sets
so that L2 holds none of them. Prints a table last. The fused (in-kernel synchronised) cross-entropy runs in a child
process with a time limit, so a hang there cannot take the rest of the results with it.

    python3 benchmarks/bench_mix.py [--out DIR] [--quick]
    python3 benchmarks/bench_mix.py --part ce_fused   # the child
"""
from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import triton
import triton.testing

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox.task import load_task  # noqa: E402
from _bench import parser, rel_l2, rotating_median_ms  # noqa: E402

COPY_GBPS = 4244.0
DEV = "cuda"
SMOKE = False  # --smoke: CPU interpreter, tiny shapes, a wall-clock timer: checks this script, not the kernels' speed
S = dict(glu=(16384, 14336), rope=(4, 4096, 32, 8, 128), ce=(8192, 128256), lce=(8192, 4096, 128256),
         adamw=(64, 1_000_000_000 // 64), copy=1 << 30)
SMOKE_S = dict(glu=(8, 300), rope=(1, 5, 4, 2, 16), ce=(4, 3000), lce=(40, 32, 300), adamw=(3, 1000), copy=1 << 12)
T0 = time.time()
ROWS: list[dict] = []
CHECKS: list[dict] = []


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def bench(fn, sets: int = 3) -> float:
    return rotating_median_ms(fn, sets, SMOKE)


def check(op: str, names, got, eager, truth) -> None:
    for name, g, e, t in zip(names, got, eager, truth):
        row = {"op": op, "output": name, "seed_rel_l2": rel_l2(g, t), "eager_rel_l2": rel_l2(e, t)}
        row["ok"] = row["seed_rel_l2"] <= max(1e-2 if g.dtype != torch.float32 else 1e-5, 4 * row["eager_rel_l2"])
        CHECKS.append(row)
        log(f"check {op} {name}: seed {row['seed_rel_l2']:.3g} eager {row['eager_rel_l2']:.3g} "
            f"{'ok' if row['ok'] else 'FAIL'}")


def record(op: str, impl: str, ms: float, nbytes: float | None = None, flops: float | None = None,
           baseline: bool = False, extra: str = "") -> None:
    row = {"op": op, "impl": impl, "ms": ms, "baseline": baseline, "extra": extra}
    if nbytes:
        row["gbps"] = nbytes / ms / 1e6
    if flops:
        row["tflops"] = flops / ms / 1e9
    ROWS.append(row)
    log(f"{op:28s} {impl:34s} {ms:9.4f} ms " + (f"{row['gbps']:7.0f} GB/s" if nbytes else "")
        + (f" {row['tflops']:6.1f} TFLOP/s" if flops else "") + f" {extra}")


def timed(op, impl, fn, nbytes=None, flops=None, baseline=False, extra=""):
    ms = bench(fn)
    record(op, impl, ms, nbytes, flops, baseline, extra)
    return ms


def empty_cache() -> None:
    if not SMOKE:
        torch.cuda.empty_cache()


def compiled(fn):
    return torch.compile(fn, dynamic=False)


def liger_of(task, model):
    fn = getattr(task.module, "crucible_liger", None)
    if fn is None or SMOKE:
        return None
    try:
        return fn(model)
    except Exception as exc:  # a missing Liger costs its rows, not the run
        log(f"liger unavailable for {task.name}: {type(exc).__name__}: {exc}")
        return None


# ---------------------------------------------------------------------------------------------------------------
def bench_glu(quick: bool) -> None:
    from seeds.swiglu import glu_bwd, glu_fwd
    M, N = S['glu']
    for act, fwd_task, bwd_task in (("silu", "swiglu_fwd", "swiglu_bwd"), ("tanh", "geglu_fwd", "geglu_bwd"),
                                    ("none", "geglu_erf_fwd", "geglu_erf_bwd")):
        tf, tb = load_task(ROOT / "tasks" / f"{fwd_task}.py"), load_task(ROOT / "tasks" / f"{bwd_task}.py")
        mf, mb = tf.make_reference(0, DEV), tb.make_reference(0, DEV)
        sets = [[torch.randn(M, N, device=DEV, dtype=torch.bfloat16) for _ in range(3)] for _ in range(3)]
        a, b, dy = sets[0]
        a64, b64, dy64 = a.double(), b.double(), dy.double()
        check(fwd_task, ["y"], [glu_fwd(a, b, act)], [mf(a, b)], [mf.double()(a64, b64)])
        check(bwd_task, ["da", "db"], glu_bwd(a, b, dy, act), mb(a, b, dy), mb.double()(a64, b64, dy64))
        del a64, b64, dy64
        fb, bb = 2 * 3 * M * N, 2 * 5 * M * N
        for blk, w in ((1024, 4), (2048, 4), (4096, 8), (8192, 8)):
            timed(fwd_task, f"seed BLOCK={blk} w={w}", lambda i: glu_fwd(sets[i][0], sets[i][1], act, blk, w), fb)
            timed(bwd_task, f"seed BLOCK={blk} w={w}", lambda i: glu_bwd(*sets[i], act, blk, w), bb)
        timed(fwd_task, "seed (heuristic)", lambda i: glu_fwd(sets[i][0], sets[i][1], act), fb)
        timed(bwd_task, "seed (heuristic)", lambda i: glu_bwd(*sets[i], act), bb)
        timed(fwd_task, "eager", lambda i: mf(sets[i][0], sets[i][1]), fb, baseline=True)
        timed(bwd_task, "eager (task Model: fwd+bwd autograd)", lambda i: mb(*sets[i]), bb, baseline=True)
        if not quick and act == "silu":
            cf = compiled(mf)
            timed(fwd_task, "torch.compile", lambda i: cf(sets[i][0], sets[i][1]), fb, baseline=True)

            def compiled_bwd(i, cf=cf):
                a_, b_ = sets[i][0].detach().requires_grad_(), sets[i][1].detach().requires_grad_()
                return torch.autograd.grad(cf(a_, b_), (a_, b_), sets[i][2])

            timed(bwd_task, "torch.compile fwd+autograd bwd", compiled_bwd, bb, baseline=True)
        lf, lb = liger_of(tf, mf), liger_of(tb, mb)
        if lf is not None:  # Liger last: its backward writes over its inputs
            timed(fwd_task, "liger", lambda i: lf(sets[i][0], sets[i][1]), fb, baseline=True)
            timed(bwd_task, "liger (fwd+bwd autograd)", lambda i: lb(*sets[i]), bb, baseline=True)
        del sets
        empty_cache()


def bench_rope(quick: bool) -> None:
    from seeds.rope import rope
    tf, tb = load_task(ROOT / "tasks/rope_fwd.py"), load_task(ROOT / "tasks/rope_bwd.py")
    mf, mb = tf.make_reference(0, DEV), tb.make_reference(0, DEV)
    B, T, HQ, HK, D = S['rope']
    cos, sin = (t.to(DEV) for t in tf.module.rope_tables(T, D))
    sets = [[torch.randn(B, T, h, D, device=DEV, dtype=torch.bfloat16) for h in (HQ, HK, HQ, HK)]
            for _ in range(3)]
    q, k, dq, dk = sets[0]
    check("rope_fwd", ["q", "k"], rope(q, k, cos, sin), mf(q, k, cos, sin),
          mf.double()(q.double(), k.double(), cos.double(), sin.double()))
    check("rope_bwd", ["dq", "dk"], rope(dq, dk, cos, sin, backward=True), mb(q, k, cos, sin, dq, dk),
          mb.double()(*(t.double() for t in (q, k, cos, sin, dq, dk))))
    nbytes = 2 * (2 * B * T * (HQ + HK) * D + 2 * T * D)
    for w in (2, 4, 8):
        timed("rope_fwd", f"seed w={w}", lambda i: rope(sets[i][0], sets[i][1], cos, sin, num_warps=w), nbytes)
        timed("rope_bwd", f"seed w={w}", lambda i: rope(sets[i][2], sets[i][3], cos, sin, True, num_warps=w), nbytes)
    timed("rope_fwd", "seed (heuristic)", lambda i: rope(sets[i][0], sets[i][1], cos, sin), nbytes)
    timed("rope_bwd", "seed (heuristic)", lambda i: rope(sets[i][2], sets[i][3], cos, sin, True), nbytes)
    timed("rope_fwd", "eager", lambda i: mf(sets[i][0], sets[i][1], cos, sin), nbytes, baseline=True)
    timed("rope_bwd", "eager (task Model: fwd+bwd autograd)", lambda i: mb(sets[i][0], sets[i][1], cos, sin,
                                                                            sets[i][2], sets[i][3]), nbytes,
          baseline=True)
    if not quick:
        cf = compiled(mf)
        timed("rope_fwd", "torch.compile", lambda i: cf(sets[i][0], sets[i][1], cos, sin), nbytes, baseline=True)

        def compiled_bwd(i):
            q_, k_ = sets[i][0].detach().requires_grad_(), sets[i][1].detach().requires_grad_()
            return torch.autograd.grad(cf(q_, k_, cos, sin), (q_, k_), (sets[i][2], sets[i][3]))

        timed("rope_bwd", "torch.compile fwd+autograd bwd", compiled_bwd, nbytes, baseline=True)
    lf, lb = liger_of(tf, mf), liger_of(tb, mb)
    if lf is not None:  # Liger last: it rotates its inputs in place
        timed("rope_fwd", "liger (in place)", lambda i: lf(sets[i][0], sets[i][1], cos, sin), nbytes, baseline=True)
        timed("rope_bwd", "liger (fwd+bwd autograd)", lambda i: lb(sets[i][0], sets[i][1], cos, sin, sets[i][2],
                                                                    sets[i][3]), nbytes, baseline=True)
    del sets
    empty_cache()


def ce_inputs(n: int, v: int):
    sets = []
    for _ in range(3):
        t = torch.randint(0, v, (n,), device=DEV)
        t[torch.rand(n, device=DEV) < 0.05] = -100
        sets.append((torch.randn(n, v, device=DEV, dtype=torch.bfloat16), t))
    return sets


def bench_ce(quick: bool, fused_only: bool) -> None:
    from seeds.cross_entropy import cross_entropy_fwd_bwd
    N, V = S['ce']
    nbytes = 2 * 2 * N * V + 8 * N
    task = load_task(ROOT / "tasks/cross_entropy.py")
    model = task.make_reference(0, DEV)
    sets = ce_inputs(N, V)
    x, t = sets[0]
    for smoothing, reduction in ((0.0, "mean"), (0.1, "sum")):
        m = task.module.Model(-100, smoothing, reduction)
        ref = m(x, t)
        truth = m(x.double(), t)
        for fused in ((True,) if fused_only else (False,)):
            got = cross_entropy_fwd_bwd(x, t, -100, smoothing, reduction, fused=fused)
            check(f"cross_entropy eps={smoothing} {reduction} fused={fused}", ["loss", "dlogits"], got, ref, truth)
            # repeat runs must agree bitwise
            again = cross_entropy_fwd_bwd(x, t, -100, smoothing, reduction, fused=fused)
            CHECKS.append({"op": f"cross_entropy fused={fused}", "output": "bitwise repeat",
                           "ok": bool(torch.equal(got[0], again[0]) and torch.equal(got[1], again[1]))})
        del ref, truth
    empty_cache()
    op = "cross_entropy fwd+bwd"
    if fused_only:
        for blk, w in ((8192, 8), (16384, 8), (16384, 16), (32768, 16)):
            timed(op, f"seed fused BLOCK={blk} w={w}",
                  lambda i: cross_entropy_fwd_bwd(*sets[i], fused=True, block=blk, num_warps=w), nbytes)
        timed(op, "seed fused (heuristic)", lambda i: cross_entropy_fwd_bwd(*sets[i], fused=True), nbytes)
        return
    for blk, w in ((8192, 8), (16384, 8), (16384, 16)):
        timed(op, f"seed 2-pass BLOCK={blk} w={w}",
              lambda i: cross_entropy_fwd_bwd(*sets[i], fused=False, block=blk, num_warps=w), nbytes)
    timed(op, "eager (task Model)", lambda i: model(*sets[i]), nbytes, baseline=True)
    if not quick:
        cf = compiled(lambda x_, t_: torch.nn.functional.cross_entropy(x_.float(), t_))

        def compiled_fb(i):
            x_ = sets[i][0].detach().requires_grad_()
            loss = cf(x_, sets[i][1])
            return loss, torch.autograd.grad(loss, x_)[0]

        timed(op, "torch.compile fwd+autograd bwd", compiled_fb, nbytes, baseline=True)
    lig = liger_of(task, model)
    if lig is not None:
        timed(op, "liger (grad over its input)", lambda i: lig(*sets[i]), nbytes, baseline=True)


def bench_lce(quick: bool, fused_ce: bool) -> None:
    from seeds.linear_cross_entropy import linear_cross_entropy_fwd_bwd
    BT, H, V = S['lce']
    flops = 3 * 2 * BT * H * V
    task = load_task(ROOT / "tasks/linear_cross_entropy.py").with_constants({"BT": BT, "H": H, "V": V})
    model = task.make_reference(0, DEV)
    w = model.weight.detach()
    sets = []
    for _ in range(3):
        t = torch.randint(0, V, (BT,), device=DEV)
        t[torch.rand(BT, device=DEV) < 0.05] = -100
        sets.append((torch.randn(BT, H, device=DEV, dtype=torch.bfloat16), t))
    x, t = sets[0]
    op = "linear+CE fwd+bwd"
    got = linear_cross_entropy_fwd_bwd(x, w, t, fused_ce=fused_ce)
    ref = model(x, t)
    m64 = copy.deepcopy(model).double()
    truth = m64(x.double(), t)
    del m64
    check(f"linear_cross_entropy fused_ce={fused_ce}", ["loss", "dx", "dweight"], got, ref, truth)
    del got, ref, truth
    empty_cache()

    def peak_gib(fn) -> float:
        if SMOKE:
            return float("nan")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn(0)
        torch.cuda.synchronize()
        del out
        return (torch.cuda.max_memory_allocated() - base) / 2**30

    variants = [dict(), dict(chunk=256, split_k=2), dict(chunk=256, split_k=4), dict(chunk=512, split_k=2),
                dict(chunk=256, split_k=2, dx_config=(128, 128, 64, 8, 3)),
                dict(chunk=256, split_k=2, logits_config=(128, 128, 64, 4, 4), dw_config=(128, 128, 64, 4, 4))]
    if fused_ce:
        variants = variants[:2]
    for kw in variants:
        fn = (lambda kw: lambda i: linear_cross_entropy_fwd_bwd(*sets[i][:1], w, sets[i][1], fused_ce=fused_ce,
                                                                 **kw))(kw)
        gib = peak_gib(fn)
        timed(op, f"seed fused_ce={fused_ce} {kw or 'heuristic'}", fn, flops=flops, extra=f"{gib:.3f} GiB")
    if fused_ce:
        return
    gib = peak_gib(lambda i: model(*sets[i]))
    timed(op, "eager (task Model)", lambda i: model(*sets[i]), flops=flops, baseline=True, extra=f"{gib:.3f} GiB")
    lig = liger_of(task, model)
    if lig is not None:
        gib = peak_gib(lambda i: lig(*sets[i]))
        timed(op, "liger", lambda i: lig(*sets[i]), flops=flops, baseline=True, extra=f"{gib:.3f} GiB")


def bench_adamw(quick: bool) -> None:
    from seeds.adamw import adamw_step
    task = load_task(ROOT / "tasks/adamw.py")
    model = task.make_reference(0, DEV)
    lr, b1, b2, eps, wd = task.init_inputs()
    if SMOKE:
        task = task.with_constants({"N0": 5000, "N1": 300, "N2": 17})
    small = [x.to(DEV) for x in task.make_inputs(0, "normal")]
    n = (len(small) - 1) // 4
    got = adamw_step(small[:n], small[n:2 * n], small[2 * n:3 * n], small[3 * n:4 * n], small[-1], lr, (b1, b2),
                     eps, wd, inplace=False)
    got = [t for lst in got for t in lst]
    check("adamw (task shapes)", [f"out{i}" for i in range(len(got))], got, model(*small),
          model.double()(*[x.double() for x in small]))
    del small
    # ANCHORS: 1B fp32 params in 64 tensors, fp32 grads.
    n_t, per = S['adamw']
    params = [torch.randn(per, device=DEV) * 0.02 for _ in range(n_t)]
    grads = [torch.randn(per, device=DEV) * 1e-3 for _ in range(n_t)]
    m = [torch.zeros(per, device=DEV) for _ in range(n_t)]
    v = [torch.zeros(per, device=DEV) for _ in range(n_t)]
    step = torch.tensor(1.0, device=DEV)
    total = n_t * per
    op = "adamw step 1B/64 tensors"
    for blk, w in ((1024, 4), (2048, 8), (4096, 8), (8192, 8)):
        timed(op, f"seed BLOCK={blk} w={w} (30 B/param)",
              lambda i: adamw_step(params, grads, m, v, step, lr, (b1, b2), eps, wd, block=blk, num_warps=w),
              30 * total)
    timed(op, "seed (heuristic, 30 B/param)", lambda i: adamw_step(params, grads, m, v, step, lr, (b1, b2), eps, wd),
          30 * total)
    tparams = [torch.nn.Parameter(p) for p in params]
    for p, g in zip(tparams, grads):
        p.grad = g
    for fused, foreach in ((True, False), (False, True)):
        opt = torch.optim.AdamW(tparams, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, fused=fused,
                                foreach=foreach)
        opt.step()
        name = "torch fused=True (28 B/param)" if fused else "torch foreach=True (28 B/param)"
        timed(op, name, lambda i, opt=opt: opt.step(), 28 * total, baseline=True)

        def with_copy(i, opt=opt):
            opt.step()
            return [p.detach().to(torch.bfloat16) for p in tparams]

        timed(op, name.replace("(28", "+ bf16 copy (34"), with_copy, 34 * total, baseline=True)
        del opt
    del params, grads, m, v, tparams
    empty_cache()


# ---------------------------------------------------------------------------------------------------------------
def copy_bandwidth() -> None:
    src = torch.empty(S['copy'], dtype=torch.uint8, device=DEV).random_(0, 255)
    dsts = [torch.empty_like(src) for _ in range(3)]
    srcs = [src, torch.empty_like(src).random_(0, 255), torch.empty_like(src).random_(0, 255)]
    timed("copy 1 GiB", "torch copy_", lambda i: dsts[i].copy_(srcs[i]), 2 * src.numel(), baseline=True)
    del src, dsts, srcs


def table() -> None:
    print("\n=== correctness (relative L2 vs float64) ===")
    for c in CHECKS:
        extra = f"seed {c['seed_rel_l2']:.3g}  eager {c['eager_rel_l2']:.3g}" if "seed_rel_l2" in c else ""
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['op']:45s} {c['output']:16s} {extra}")
    print("\n=== timings (median ms; GB/s on the minimum bytes; % of 4,244 GB/s copy) ===")
    ops = []
    for r in ROWS:
        if r["op"] not in ops:
            ops.append(r["op"])
    print(f"{'op':26s} {'impl':44s} {'ms':>9s} {'GB/s':>7s} {'%copy':>6s} {'TFLOP/s':>8s} {'vs best base':>12s} extra")
    for op in ops:
        rows = [r for r in ROWS if r["op"] == op]
        base = [r["ms"] for r in rows if r["baseline"]]
        best = min(base) if base else None
        for r in rows:
            gbps = f"{r['gbps']:7.0f}" if "gbps" in r else " " * 7
            pct = f"{100 * r['gbps'] / COPY_GBPS:5.1f}%" if "gbps" in r else " " * 6
            tf = f"{r['tflops']:8.1f}" if "tflops" in r else " " * 8
            sp = f"{best / r['ms']:11.2f}x" if best and not r["baseline"] else " " * 12
            print(f"{op:26s} {r['impl']:44s} {r['ms']:9.4f} {gbps} {pct} {tf} {sp} {r['extra']}")


def run_child(args, out: Path) -> None:
    """The fused cross-entropy (programs of a row wait on each other) in a child with a time limit."""
    log("--- ce_fused (child process)")
    cmd = [sys.executable, __file__, "--part", "ce_fused", "--out", str(out)] + (["--quick"] if args.quick else [])
    child_timeout = max(20.0, min(75.0, args.budget - (time.time() - T0) - 60))
    child = out / "ce_fused.json"
    child.unlink(missing_ok=True)
    try:
        if SMOKE:
            raise subprocess.TimeoutExpired(cmd, 0)  # the fused kernel waits on other programs: GPU only
        proc = subprocess.run(cmd, timeout=child_timeout)
        status = f"child exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        status = f"TIMEOUT {child_timeout:.0f}s (hang?)"
    if child.exists():  # what the child finished before any hang or failure
        data = json.loads(child.read_text())
        ROWS.extend(data["rows"])
        CHECKS.extend(data["checks"])
    CHECKS.append({"op": "fused child", "output": status, "ok": status == "child exit 0"})


def main() -> int:
    ap = parser(__doc__.splitlines()[0], 280.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="skip torch.compile baselines")
    ap.add_argument("--part", default="main", choices=["main", "ce_fused"])
    args = ap.parse_args()
    global DEV, SMOKE
    if args.smoke:
        DEV, SMOKE = "cpu", True
        S.update(SMOKE_S)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = "none (smoke)" if SMOKE else torch.cuda.get_device_name()
    log(f"GPU {gpu} torch {torch.__version__} triton {triton.__version__}")
    if args.part == "ce_fused":
        for name, step in (("ce_fused", lambda: bench_ce(args.quick, fused_only=True)),
                           ("lce_fused", lambda: bench_lce(args.quick, fused_ce=True))):
            try:
                step()
            except Exception:
                log(f"step {name} failed:\n{traceback.format_exc()}")
                CHECKS.append({"op": name, "output": "step raised (see log)", "ok": False})
            (out / "ce_fused.json").write_text(json.dumps({"rows": ROWS, "checks": CHECKS}))
        return 0
    # Most important first; torch.compile baselines are dropped once the budget runs short.
    steps = [("copy", lambda q: copy_bandwidth()), ("ce", lambda q: bench_ce(q, False)),
             ("ce_fused child", lambda q: run_child(args, out)), ("glu", lambda q: bench_glu(q)), ("rope", lambda q: bench_rope(q)),
             ("adamw", lambda q: bench_adamw(q)), ("lce", lambda q: bench_lce(q, False))]
    for name, step in steps:
        quick = args.quick or SMOKE or time.time() - T0 > 0.45 * args.budget
        log(f"--- {name}{' (no torch.compile)' if quick and not args.quick else ''}")
        try:
            step(quick)
        except Exception:  # one op's failure must not cost the other ops' numbers
            log(f"step {name} failed:\n{traceback.format_exc()}")
            CHECKS.append({"op": name, "output": "step raised (see log)", "ok": False})
            empty_cache()
        (out / "bench_mix.json").write_text(json.dumps({"rows": ROWS, "checks": CHECKS}))
    (out / "bench_mix.json").write_text(json.dumps({"rows": ROWS, "checks": CHECKS}))
    table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
