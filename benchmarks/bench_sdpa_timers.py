"""Why `crucible bench` reads SDPA attention faster than ANCHORS.md: which backend eager SDPA picks, and what
crucible's timer (profiler.timing.measure: one call at a time, L2 flushed, device synchronised around each call) and
triton's do_bench (calls back to back) say about the same kernels, in one GPU call.

    python3 benchmarks/bench_sdpa_timers.py          # H200, ~90 s; tables last

Compute-bound kernels run at a clock that depends on how busy the GPU has been: between crucible's isolated timed
calls the device idles while the host synchronises, do_bench keeps it busy. Sustained mode (measure's `burst`)
queues calls back to back, after untimed heating calls (`settle_ms`); this script times SDPA (cuDNN, flash), the
attention seed and a memory-bound control under each pacing of PACINGS, and shows times by position in a burst.
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


# (label, burst, settle_ms): isolated calls; bursts from idle; bursts after heating; long bursts
PACINGS = (("isolated", 1, 0.0), ("b10", 10, 0.0), ("b10 s25", 10, 25.0), ("b10 s50", 10, 50.0),
           ("b10 s100", 10, 100.0), ("b10 s200", 10, 200.0), ("b30", 30, 0.0))
POSITIONS = "b10 s100"  # the pacing whose times are shown by position in the burst


def _median(xs):
    s = sorted(xs)
    return s[len(s) // 2]


def _seed_attention():
    """The attention seed's ModelNew (SEED_ATTN: a path to another copy of seeds/attention.py)."""
    import importlib.util
    import os
    path = os.environ.get("SEED_ATTN", "seeds/attention.py")
    spec = importlib.util.spec_from_file_location("seed_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ModelNew()


def main() -> int:
    table, sdpa_kernel = backends()
    sets = [[torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)] for _ in range(4)]
    rows, positions = [], {}
    cases = []
    for name in ("default", "flash"):
        def call(args, backend=table[name]):
            if backend is None:
                return F.scaled_dot_product_attention(*args)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(*args)
        cases.append((f"sdpa {name}", call, FLOPS, "TFLOP/s"))
    seed = _seed_attention()
    cases.append(("crucible seed", lambda args: seed(*args), FLOPS, "TFLOP/s"))
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
        per = {}
        for label, burst, settle in PACINGS:
            report = measure({name: call}, inputs * 20, reps=30, warmup=5, burst=burst, settle_ms=settle)
            p = report["fns"][name]
            per[label] = _median(p["ms"])
            if label == POSITIONS:
                positions[name] = [_median(p["ms"][j::burst]) for j in range(burst)]
                print(f"{name}: flagged {len(p['flagged'])}, heat calls {report['config']['heat_calls']}")
        rows.append((name, unit, work, back_to_back, per))
        print(f"{name}: do_bench {back_to_back:.4f} ms, " + ", ".join(f"{k}: {v:.4f}" for k, v in per.items()),
              flush=True)
    print(f"\nms by position in the bursts of '{POSITIONS}':")
    for name, pos in positions.items():
        print(f"{name:14s} " + " ".join(f"{v:.3f}" for v in pos))
    print(f"\nms (and TFLOP/s or GB/s) by pacing; last column: do_bench / '{POSITIONS}'")
    print(f"{'impl':14s} {'do_bench':>16s} " + " ".join(f"{label:>16s}" for label, _, _ in PACINGS))
    for name, unit, work, a, per in rows:
        cells = " ".join(f"{per[label]:8.4f} {work / per[label] / 1e9:7.1f}" for label, _, _ in PACINGS)
        print(f"{name:14s} {a:8.4f} {work / a / 1e9:7.1f} {cells} {a / per[POSITIONS]:6.3f}")
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
