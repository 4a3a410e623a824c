"""Does profiler.timing.measure agree with triton.testing.do_bench, and with ANCHORS.md, on the H200?

For the ANCHORS rows RMSNorm fwd 16384x4096, softmax 16384x8192, SwiGLU 16384x14336 (bf16) and SDPA fwd
B4 H32 S4096 D128 (bf16): each implementation (eager, torch.compile, Liger, SDPA backends) is timed by `measure`
(all of an op's implementations interleaved in one call, L2 flushed, device-synchronised) and by
`triton.testing.do_bench(..., return_mode="median")` as ANCHORS.md was. Then the device ceilings (profiler.ceilings),
each row's % of roofline and gate verdict, compile stats of Liger's Triton kernels, and an Nsight Compute probe when
`ncu` is on PATH and time allows. Prints a table last; full results to $OUT/bench_profiler.json.

    python3 benchmarks/bench_profiler.py          # on the GPU machine (Liger from .whl on PYTHONPATH if wanted)
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from profiler import compile_stats  # noqa: E402
from profiler.ceilings import measure_ceilings  # noqa: E402
from profiler.env import environment  # noqa: E402
from profiler.roofline import gate, roofline  # noqa: E402
from profiler.stats import summarize  # noqa: E402
from profiler.timing import measure  # noqa: E402

T0 = time.time()
BF16 = torch.bfloat16
DEV = "cuda"
N_SETS = 6


def randn(*shape, gen):
    return torch.randn(*shape, device=DEV, dtype=BF16, generator=gen)


def rmsnorm_op(gen):
    M, N, eps = 16384, 4096, 1e-6
    w = (1 + 0.1 * randn(N, gen=gen)).to(BF16)

    def eager(a):
        return F.rms_norm(a[0], (N,), w, eps)

    def hf(a):  # transformers' LlamaRMSNorm.forward
        x = a[0]
        xf = x.to(torch.float32)
        var = xf.pow(2).mean(-1, keepdim=True)
        return w * (xf * torch.rsqrt(var + eps)).to(x.dtype)

    impls = {"eager F.rms_norm": (eager, 3174), "eager HF-style": (hf, 312),
             "torch.compile": (torch.compile(lambda a: F.rms_norm(a[0], (N,), w, eps)), 3465)}
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm

        lg = LigerRMSNorm(N, eps=eps).to(DEV, BF16)
        lg.weight.data.copy_(w)
        impls["Liger"] = (lambda a: lg(a[0]), 3895)
    except ImportError as exc:
        print(f"liger unavailable: {exc}")
    sets = [[randn(M, N, gen=gen)] for _ in range(N_SETS)]
    return "RMSNorm fwd 16384x4096", impls, sets, ("gbps", 2 * (2 * M * N + N), 0)


def softmax_op(gen):
    M, N = 16384, 8192
    impls = {"eager": (lambda a: torch.softmax(a[0], -1), 1059),
             "torch.compile": (torch.compile(lambda a: torch.softmax(a[0], -1)), 1736)}
    sets = [[randn(M, N, gen=gen)] for _ in range(N_SETS)]
    return "softmax fwd 16384x8192", impls, sets, ("gbps", 2 * 2 * M * N, 0)


def swiglu_op(gen):
    M, N = 16384, 14336
    impls = {"eager": (lambda a: F.silu(a[0]) * a[1], 2506),
             "torch.compile": (torch.compile(lambda a: F.silu(a[0]) * a[1]), 4343)}
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        impls["Liger"] = (lambda a: LigerSiLUMulFunction.apply(a[0], a[1]), 4318)
    except ImportError as exc:
        print(f"liger unavailable: {exc}")
    sets = [[randn(M, N, gen=gen), randn(M, N, gen=gen)] for _ in range(N_SETS)]
    return "SwiGLU fwd 16384x14336", impls, sets, ("gbps", 3 * 2 * M * N, 0)


def sdpa_op(gen):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, S, D = 4, 32, 4096, 128

    def with_backend(backend):
        def run(a):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(a[0], a[1], a[2])
        return run

    impls = {"SDPA flash": (with_backend(SDPBackend.FLASH_ATTENTION), 340),
             "SDPA cuDNN": (with_backend(SDPBackend.CUDNN_ATTENTION), 597),
             "SDPA default": (lambda a: F.scaled_dot_product_attention(a[0], a[1], a[2]), None)}
    sets = [[randn(B, H, S, D, gen=gen) for _ in range(3)] for _ in range(N_SETS)]
    return "attention fwd B4 H32 S4096 D128", impls, sets, ("tflops", 4 * 2 * B * H * S * D, 4 * B * H * S * S * D)


def main() -> None:
    out_dir = Path(os.environ.get("OUT", "/tmp"))
    env = environment()
    print(f"{env['gpu']['name']}, driver {env['driver']}, torch {env['torch']}, triton {env['triton']}, "
          f"liger {env['liger_kernel']}", flush=True)
    ceil = measure_ceilings(0)
    print(f"ceilings: copy {ceil['copy_gbps']:.0f} GB/s; matmul " +
          ", ".join(f"{k} {v:.0f}" for k, v in ceil["matmul_tflops"].items()) + " TFLOP/s", flush=True)
    gen = torch.Generator(device=DEV).manual_seed(0)
    rows, results = [], {"environment": env, "ceilings": ceil, "ops": {}}
    with torch.no_grad():
        for make in (rmsnorm_op, softmax_op, swiglu_op, sdpa_op):
            op, impls, sets, (metric, nbytes, flops) = make(gen)
            fns = {}
            for name, (fn, _) in impls.items():
                try:
                    fn(sets[0])  # compile / autotune before anything is timed
                    torch.cuda.synchronize()
                    fns[name] = fn
                except Exception as exc:  # noqa: BLE001 - a baseline that does not run here is reported
                    print(f"{op} / {name}: {type(exc).__name__}: {str(exc)[:200]}")
            t = time.time()
            m = measure(fns, sets, reps=30, warmup=5)
            roof = roofline(nbytes, flops, ceil, "bf16")
            res = {"measure_s": time.time() - t, "warnings": m["warnings"], "impls": {}}
            for name in fns:
                p = m["fns"][name]
                if p["error"]:
                    print(f"{op} / {name} failed in measure: {p['error']['message'][:200]}")
                    continue
                s = summarize(p["ms"])
                db = triton.testing.do_bench(lambda fn=fns[name]: fn(sets[0]), return_mode="median")
                rate = (nbytes / (s.median * 1e-3) / 1e9) if metric == "gbps" else flops / (s.median * 1e-3) / 1e12
                rate_db = (nbytes / (db * 1e-3) / 1e9) if metric == "gbps" else flops / (db * 1e-3) / 1e12
                anchor = impls[name][1]
                g = gate(s.median, roof)
                rows.append((op, name, s.median, s.iqr, db, metric, rate, rate_db, anchor,
                             100 * roof.floor_ms / s.median, g.ok, f"{len(p['flagged'])}/{p['host_bound']}"))
                res["impls"][name] = {"ms": s.median, "iqr_ms": s.iqr, "do_bench_ms": db, "rate": rate,
                                      "rate_do_bench": rate_db, "anchor": anchor, "metric": metric,
                                      "pct_of_roofline": 100 * roof.floor_ms / s.median, "gate_ok": g.ok,
                                      "flagged_calls": len(p["flagged"]), "inconsistent": p["inconsistent"],
                                      "host_bound_calls": p["host_bound"], "host_ms": p["host_ms"],
                                      "ms_all": p["ms"]}
            res["fingerprint_mismatches"] = len(m["fingerprint_mismatches"])
            res["persisting_l2"] = m["l2"]["persisting_reset"] or m["l2"]["persisting_error"]
            res["calibration"] = m["calibration"]
            res["cover"] = {k: m["config"][k] for k in ("cover_ms", "flush_passes", "flush_pass_ms", "stream_priority")}
            results["ops"][op] = res
            print(f"{op}: measured in {res['measure_s']:.1f} s; persisting L2 reset: {res['persisting_l2']}",
                  flush=True)
            del sets, m
            torch.cuda.empty_cache()

    try:
        import liger_kernel.ops.rms_norm as lrms
        import liger_kernel.ops.swiglu as lswiglu

        ks = compile_stats.kernel_stats(vars(lrms)) + compile_stats.kernel_stats(vars(lswiglu))
        results["liger_kernel_stats"] = [k.to_dict() for k in ks]
        for k in ks:
            print("compile stats:", k.describe())
    except ImportError:
        pass

    if compile_stats.ncu_available() and time.time() - T0 < 100:
        probe = Path("/tmp/ncu_probe.py")
        probe.write_text("import torch, torch.nn.functional as F\n"
                         "x = torch.randn(16384, 4096, device='cuda', dtype=torch.bfloat16)\n"
                         "w = torch.ones(4096, device='cuda', dtype=torch.bfloat16)\n"
                         "for _ in range(3): F.rms_norm(x, (4096,), w, 1e-6)\n"
                         "torch.cuda.synchronize()\n")
        try:
            t = time.time()
            ncu = compile_stats.ncu_metrics([sys.executable, str(probe)], kernel_regex="rms|norm", launch_count=2,
                                            timeout_s=70)
            results["ncu_probe"] = ncu
            print(f"ncu probe ({time.time() - t:.0f} s): {json.dumps(ncu)[:800]}")
        except Exception as exc:  # noqa: BLE001 - the probe is optional
            results["ncu_probe_error"] = f"{type(exc).__name__}: {exc}"
            print(f"ncu probe failed: {str(exc)[:300]}")

    (out_dir / "bench_profiler.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\nceilings: copy {ceil['copy_gbps']:.0f} GB/s (ANCHORS 4244); matmul TFLOP/s " +
          ", ".join(f"{k} {v:.0f}" for k, v in ceil["matmul_tflops"].items()) + " (ANCHORS bf16 694-788)")
    print(f"{'op':34} {'impl':18} {'measure ms':>10} {'IQR':>7} {'do_bench':>9} {'rate':>8} {'rate db':>8} "
          f"{'ANCHORS':>8} {'vs anch':>7} {'%roof':>6} {'gate':>5} {'flag/host':>9}")
    for op, name, ms, iqr, db, metric, rate, rate_db, anchor, pct, ok, flags in rows:
        unit = "GB/s" if metric == "gbps" else "TF/s"
        vs = f"{rate / anchor:.2f}" if anchor else "-"
        print(f"{op:34} {name:18} {ms:10.4f} {iqr:7.4f} {db:9.4f} {rate:8.0f} {rate_db:8.0f} "
              f"{(str(anchor) if anchor else '-'):>8} {vs:>7} {pct:6.1f} {'ok' if ok else 'FAIL':>5} {flags:>9}  {unit}")
    print(f"total {time.time() - T0:.0f} s")


if __name__ == "__main__":
    main()
