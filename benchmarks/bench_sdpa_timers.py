"""Why `crucible bench` reads SDPA attention faster than ANCHORS.md: which backend eager SDPA picks, and what
crucible's timer (profiler.timing.measure: one call at a time, L2 flushed, device synchronised around each call) and
triton's do_bench (calls back to back) say about the same kernels, in one GPU call.

    python3 benchmarks/bench_sdpa_timers.py          # H200, ~60 s; tables last

Compute-bound kernels run at a clock that depends on how busy the GPU has been: between crucible's isolated timed
calls the device idles while the host synchronises, do_bench keeps it busy. Sustained mode (measure's `burst`)
queues calls back to back; this script times each backend with bursts of 1, 3, 10 and 30 calls, shows the time by
position in a 30-call burst (where the clock settles), and a memory-bound control that should not care.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from profiler.timing import measure  # noqa: E402

B, H, S, D = 4, 32, 4096, 128
FLOPS = 4 * B * H * S * S * D


def backends():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}, sdpa_kernel


BURSTS = (1, 3, 10, 30)


def _median(xs):
    s = sorted(xs)
    return s[len(s) // 2]


def main() -> int:
    table, sdpa_kernel = backends()
    sets = [[torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)] for _ in range(4)]
    rows, positions = [], {}
    cases = []
    for name, backend in table.items():
        def call(args, backend=backend):
            if backend is None:
                return F.scaled_dot_product_attention(*args)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(*args)
        cases.append((name, call, FLOPS, "TFLOP/s"))
    big = [[torch.randn(1 << 27, device="cuda", dtype=torch.bfloat16)] for _ in range(4)]  # 256 MiB: memory-bound
    cases.append(("mem-bound x*2", lambda args: args[0] * 2, 2 * 2 * (1 << 27), "GB/s"))
    for name, call, work, unit in cases:
        inputs = big if unit == "GB/s" else sets
        state = {"i": 0}

        def rotating(call=call, inputs=inputs):
            call(inputs[state["i"] % len(inputs)])
            state["i"] += 1
        try:
            rotating()
        except RuntimeError as exc:
            print(f"{name}: not available ({str(exc).splitlines()[0][:120]})")
            continue
        back_to_back = triton.testing.do_bench(rotating, warmup=25, rep=200, return_mode="median")
        per_burst = {}
        for b in BURSTS:
            report = measure({name: call}, inputs * 20, reps=30, warmup=5, burst=b)
            ms = report["fns"][name]["ms"]
            per_burst[b] = _median(ms)
            if b == BURSTS[-1]:
                positions[name] = [_median(ms[j::b]) for j in range(b)]
        rows.append((name, unit, work, back_to_back, per_burst))
        print(f"{name}: do_bench {back_to_back:.4f} ms, measure " +
              ", ".join(f"burst {b}: {v:.4f}" for b, v in per_burst.items()), flush=True)
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            F.scaled_dot_product_attention(*sets[0])
            torch.cuda.synchronize()
        names = sorted({e.key for e in prof.key_averages()})
        print("\ndefault SDPA ran:", "; ".join(k[:100] for k in names if "aten::" not in k)[:1500])
    except Exception as exc:  # noqa: BLE001 - the backend name is a nicety; the timings above are the point
        print(f"\nprofiler unavailable: {exc}")
    print(f"\nms by position in a {BURSTS[-1]}-call burst (median over the run's bursts):")
    for name, pos in positions.items():
        print(f"{name:14s} " + " ".join(f"{v:.3f}" for v in pos))
    print(f"\n{'impl':14s} {'unit':8s} {'do_bench':>10s} " + " ".join(f"{'burst ' + str(b):>16s}" for b in BURSTS)
          + f" {'do_bench/burst10':>17s}")
    for name, unit, work, a, per in rows:
        cells = " ".join(f"{per[b]:8.4f} {work / per[b] / 1e9:7.1f}" for b in BURSTS)
        print(f"{name:14s} {unit:8s} {a:10.4f} {cells} {a / per[10]:17.3f}")
    print(f"do_bench {FLOPS / rows[0][3] / 1e9 if rows else 0:.1f} TFLOP/s for the default backend; "
          f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
