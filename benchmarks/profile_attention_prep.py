"""Where the fp16 working copies' preparation spends its time on the H200 (seeds/attention_gluon_train.py:
input_amax, the host sync, fp16_copies; one launch over the four tensors, and split: one a tensor), B4 H32 S4096 D128 bf16: the kernels' own CUDA times under
torch.profiler, next to the wall time of the whole preparation (CUDA events, 20 calls after a warm-up).
    python3 benchmarks/profile_attention_prep.py      # the H200 (torch 2.11, triton 3.6)"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from seeds import attention_gluon_train as T  # noqa: E402


def prep(q, k, v, do, split):
    return T.fp16_copies(q, k, v, do, T.fp16_exponent(q, k, v, do, split), split)


def main() -> int:
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
