"""Why Liger's RMSNorm and softmax forwards lead the seeds by ~5% (crucible bench): the same one-row-per-program
kernel with each memory hint switched on and off, against the seeds' launchers and Liger, in one GPU call.

    python3 benchmarks/bench_fwd_variants.py            # H200: ~60 s; prints a table last, JSON to $OUT if set
    python3 benchmarks/bench_fwd_variants.py --smoke    # CPU interpreter, tiny shapes: checks the script only

Knobs: LOAD (none | evict_first | ca: the ".ca" cache modifier Liger's softmax uses), STORE_CS (the ".cs" streaming
store), warps. Every variant's output is checked against float64 before it is timed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._bench import rel_l2, rotating_median_ms  # noqa: E402

LOADS = {"none": 0, "evict_first": 1, "ca": 2}


@triton.jit
def _load(ptr, mask, other, LOAD: tl.constexpr):
    if LOAD == 1:
        x = tl.load(ptr, mask=mask, other=other, eviction_policy="evict_first")
    elif LOAD == 2:
        x = tl.load(ptr, mask=mask, other=other, cache_modifier=".ca")
    else:
        x = tl.load(ptr, mask=mask, other=other)
    return x


@triton.jit
def _store(ptr, value, mask, STORE_CS: tl.constexpr):
    if STORE_CS:
        tl.store(ptr, value, mask=mask, cache_modifier=".cs")
    else:
        tl.store(ptr, value, mask=mask)


@triton.jit
def _rmsnorm_row(X, W, Y, N, stride, eps, BLOCK: tl.constexpr, LOAD: tl.constexpr, STORE_CS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = _load(X + row * stride + cols, mask, 0.0, LOAD).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    _store(Y + row * stride + cols, (x * rstd * w).to(Y.dtype.element_ty), mask, STORE_CS)


@triton.jit
def _softmax_row(X, Y, N, stride, BLOCK: tl.constexpr, LOAD: tl.constexpr, STORE_CS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = _load(X + row * stride + cols, mask, float("-inf"), LOAD).to(tl.float32)
    e = tl.exp2((x - tl.max(x, axis=0)) * 1.4426950408889634)
    _store(Y + row * stride + cols, (e / tl.sum(e, axis=0)).to(Y.dtype.element_ty), mask, STORE_CS)


def rmsnorm_variant(load: str, store_cs: bool, warps: int):
    def run(x, w, eps):
        y = torch.empty_like(x)
        n = x.shape[-1]
        _rmsnorm_row[(x.shape[0],)](x, w, y, n, x.stride(0), eps, BLOCK=triton.next_power_of_2(n),
                                    LOAD=LOADS[load], STORE_CS=store_cs, num_warps=warps)
        return y
    return run


def softmax_variant(load: str, store_cs: bool, warps: int):
    def run(x):
        y = torch.empty_like(x)
        n = x.shape[-1]
        _softmax_row[(x.shape[0],)](x, y, n, x.stride(0), BLOCK=triton.next_power_of_2(n), LOAD=LOADS[load],
                                    STORE_CS=store_cs, num_warps=warps)
        return y
    return run


def liger(op: str):
    try:
        if op == "rmsnorm":
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction
            return lambda x, w, eps: LigerRMSNormFunction.apply(x, w, eps)
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
        return lambda x: LigerSoftmaxFunction.apply(x)
    except ImportError as exc:
        print(f"liger not importable: {exc}")
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    dev = "cpu" if args.smoke else "cuda"
    from seeds.rmsnorm import rmsnorm_fwd
    from seeds.softmax import softmax_fwd

    rows = []
    sets = 2 if args.smoke else 6
    shapes = {"rmsnorm": (64, 256) if args.smoke else (16384, 4096),
              "softmax": (64, 512) if args.smoke else (16384, 8192)}
    warps_for = {"rmsnorm": (4, 8, 16), "softmax": (8, 16, 32)} if not args.smoke else {"rmsnorm": (4,),
                                                                                         "softmax": (4,)}
    for op, (m, n) in shapes.items():
        gen = torch.Generator(device=dev).manual_seed(0)
        xs = [torch.randn(m, n, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(sets)]
        w = (1.0 + 0.1 * torch.randn(n, device=dev, generator=gen)).to(torch.bfloat16)
        eps = 1e-6
        if op == "rmsnorm":
            truth = torch.nn.functional.rms_norm(xs[0].double(), (n,), w.double(), eps)
            impls = {"seed": lambda x: rmsnorm_fwd(x, w, eps),
                     "eager": lambda x: torch.nn.functional.rms_norm(x, (n,), w, eps)}
            lg = None if args.smoke else liger("rmsnorm")
            if lg:
                impls["liger"] = lambda x, lg=lg: lg(x, w, eps)
            for load in LOADS:
                for cs in (False, True):
                    for wp in warps_for[op]:
                        f = rmsnorm_variant(load, cs, wp)
                        impls[f"row load={load} cs={int(cs)} w={wp}"] = lambda x, f=f: f(x, w, eps)
            nbytes = 2 * (2 * m * n + n)
        else:
            truth = torch.softmax(xs[0].double(), -1)
            impls = {"seed": softmax_fwd, "eager": lambda x: torch.softmax(x, -1)}
            lg = None if args.smoke else liger("softmax")
            if lg:
                impls["liger"] = lg
            for load in LOADS:
                for cs in (False, True):
                    for wp in warps_for[op]:
                        impls[f"row load={load} cs={int(cs)} w={wp}"] = softmax_variant(load, cs, wp)
            nbytes = 2 * 2 * m * n
        for name, fn in impls.items():
            err = rel_l2(fn(xs[0]), truth)
            if not err < 1e-2:
                print(f"WRONG {op} {name}: rel L2 {err:.3g}")
                rows.append({"op": op, "impl": name, "ms": None, "gbps": None, "rel_l2": err})
                continue
            ms = rotating_median_ms(lambda i, fn=fn: fn(xs[i]), sets, args.smoke)
            rows.append({"op": op, "impl": name, "ms": ms, "gbps": nbytes / ms / 1e6, "rel_l2": err})
            print(f"{op:8s} {name:32s} {ms:.4f} ms", flush=True)
    print(f"\n{'op':8s} {'impl':32s} {'ms':>8s} {'GB/s':>7s} {'vs liger':>8s} {'rel L2':>8s}")
    for op in shapes:
        mine = [r for r in rows if r["op"] == op]
        ref = next((r["ms"] for r in mine if r["impl"] == "liger" and r["ms"]), None)
        for r in sorted(mine, key=lambda r: r["ms"] or 1e9):
            if r["ms"] is None:
                print(f"{op:8s} {r['impl']:32s} {'wrong':>8s}")
                continue
            vs = f"{ref / r['ms']:.3f}" if ref else "-"
            print(f"{op:8s} {r['impl']:32s} {r['ms']:8.4f} {r['gbps']:7.0f} {vs:>8s} {r['rel_l2']:8.1e}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_fwd_variants.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
