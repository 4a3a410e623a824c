"""Where the fp16 working copies' preparation spends its time on the H200 (seeds/attention_gluon_train.py:
input_amax, the host sync, fp16_copies; one launch over the four tensors, and split: one a tensor), B4 H32 S4096
D128 bf16: the kernels' own CUDA times under torch.profiler, next to the wall time of the whole preparation (CUDA
events, 20 calls after a warm-up). --variants instead: what one tensor's copy to fp16 and its largest magnitude
reach (GB/s, do_bench) as torch's own copy (`.to`, which the harness allows) and as the module's split kernels
at several block sizes and warp counts (measured on the H200: about 1.5-2 TB/s). --timeline: the fwd+bwd seed's
whole call (seeds/attention_bwd.py ModelNew, both modes), each GPU kernel of the last of 4 back-to-back calls
with its duration and the idle gap before it (torch.profiler), so the host sync's and the launches' cost shows.
    python3 benchmarks/profile_attention_prep.py [--variants | --timeline]   # the H200 (torch 2.11, triton 3.6)"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from seeds import attention_gluon_train as T  # noqa: E402


def prep(q, k, v, do, split):
    return T.fp16_copies(q, k, v, do, T.fp16_exponent(q, k, v, do, split), split)


def variants() -> int:
    """GB/s of one [4, 32, 4096, 128] bf16 tensor's fp16 copy (read + write) and largest magnitude (read)."""
    import triton
    from triton.testing import do_bench
    x = torch.randn(4, 32, 4096, 128, device="cuda").to(torch.bfloat16)
    y = torch.empty(x.shape, dtype=torch.float16, device="cuda")
    amax = torch.zeros(1, dtype=torch.float32, device="cuda")
    n = x.numel()
    rows = [("torch x.to(float16)", lambda: x.to(torch.float16), 4 * n)]
    for block in (1024, 2048, 4096, 8192, 16384):
        for warps in (4, 8, 16):
            grid = (triton.cdiv(n, block),)
            rows.append((f"_copy_fp16_kernel BLOCK {block} warps {warps}",
                         lambda g=grid, b=block, w=warps: T._copy_fp16_kernel[g](x, y, n, 4.0, BLOCK=b, num_warps=w),
                         4 * n))
            rows.append((f"_amax_kernel BLOCK {block} warps {warps}",
                         lambda g=grid, b=block, w=warps: T._amax_kernel[g](x, amax, n, BLOCK=b, num_warps=w), 2 * n))
    for name, fn, nbytes in rows:
        ms = do_bench(fn, warmup=10, rep=50, return_mode="median")
        print(f"{name:44s} {ms * 1e3:8.1f} us {nbytes / ms / 1e6:8.0f} GB/s", flush=True)
    return 0


def timeline() -> int:
    """Kernel by kernel, the seed's fwd+bwd call on the GPU: start (us from the call's first kernel), duration,
    and the gap since the previous kernel ended; the call's GPU span and its idle total last."""
    from seeds.attention_bwd import ModelNew
    q, k, v, do = (torch.randn(4, 32, 4096, 128, device="cuda").to(torch.bfloat16) for _ in range(4))
    for causal in (False, True):
        model = ModelNew(causal)
        for _ in range(3):
            model(q, k, v, do)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(4):
                model(q, k, v, do)
            torch.cuda.synchronize()
        kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                         key=lambda e: e.time_range.start)
        per_call = len(kernels) // 4
        last = kernels[-per_call:]
        t0, prev_end, idle = last[0].time_range.start, None, 0.0
        print(f"\n{'causal' if causal else 'non-causal'}: {per_call} kernels a call; the last call:")
        for e in last:
            gap = 0.0 if prev_end is None else e.time_range.start - prev_end
            idle += max(gap, 0.0)
            print(f"  {e.time_range.start - t0:9.1f} us  {e.time_range.end - e.time_range.start:9.1f} us  "
                  f"gap {gap:7.1f} us  {e.name[:70]}")
            prev_end = e.time_range.end
        prev_call_end = kernels[-per_call - 1].time_range.end
        print(f"  span {last[-1].time_range.end - t0:.1f} us, idle inside {idle:.1f} us, "
              f"gap from the previous call {t0 - prev_call_end:.1f} us")
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--variants"]:
        return variants()
    if sys.argv[1:2] == ["--timeline"]:
        return timeline()
    q, k, v, do = (torch.randn(4, 32, 4096, 128, device="cuda").to(torch.bfloat16) for _ in range(4))
    for split in (False, True):
        for _ in range(3):
            prep(q, k, v, do, split)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            prep(q, k, v, do, split)
        end.record()
        torch.cuda.synchronize()
        print(f"preparation split={split}, wall (events, 20 calls): {start.elapsed_time(end) / 20:.3f} ms a call")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                prep(q, k, v, do, split)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
