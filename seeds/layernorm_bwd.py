"""LayerNorm backward task seed: (x, dy) -> (dx, dw, db) through the kernels of seeds/layernorm.py.

One persistent kernel reads x and dy once, recomputes mean and rstd, writes dx and keeps fp32 partial dw and db per
program; a second kernel adds both sets of partials in a fixed order. Bytes (bf16, 16384x4096): 3·M·N·2 = 403 MB.

Measured on the H200 (docs/bench-norms.md): 0.1646 ms = 2,446 GB/s at 16384x4096 bf16, 1.44x the best
baseline (eager F.layer_norm backward, 1,700 GB/s); short of the 2,800 GB/s of ANCHORS.md. With the next row
prefetched under a 128-register cap (the GPU default, benchmarks/sweep_norm_bwd.py): 0.1201 ms =
3,352 GB/s.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from seeds.layernorm import layernorm_bwd

CRUCIBLE_SEED = {"name": "layernorm_bwd", "tasks": ["layernorm_bwd.py"], "ops": ["LayerNorm bwd (dx, dw, db)"]}


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.bias = nn.Parameter(torch.zeros(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor, dy: torch.Tensor):
        return layernorm_bwd(x, self.weight.detach(), self.bias.detach(), dy, self.eps)
