"""RMSNorm backward task seed: (x, dy) -> (dx, dw) through the kernels of seeds/rmsnorm.py.

One persistent kernel reads x and dy once, recomputes rstd, writes dx and keeps fp32 partial dw per program; a second
kernel adds the partials in a fixed order. Bytes (bf16, 16384x4096): 3·M·N·2 = 403 MB.

Measured on the H200 (docs/bench-norms.md): 0.1535 ms = 2,624 GB/s at 16384x4096 bf16, 1.48x the best
baseline (eager F.rms_norm backward, 1,770 GB/s); short of the 3,000 GB/s of ANCHORS.md. With the next row
prefetched (the GPU default, benchmarks/sweep_norm_bwd.py): 0.1193 ms = 3,376 GB/s.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from seeds.rmsnorm import rmsnorm_bwd

CRUCIBLE_SEED = {"name": "rmsnorm_bwd", "tasks": ["rmsnorm_bwd.py"], "ops": ["RMSNorm bwd (dx, dw)"]}


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor, dy: torch.Tensor):
        return rmsnorm_bwd(x, self.weight.detach(), dy, self.eps)
