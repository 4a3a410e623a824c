"""Softmax backward task seed: (x, dy) -> dx through the kernel of seeds/softmax.py, recomputing y from x in registers.

One pass: read x and dy, write dx. Bytes (bf16, 16384x8192): 3·M·N·2 = 805 MB.

Measured on the H200 (2026-11-29, docs/bench-norms.md): 0.2164 ms = 3,721 GB/s at 16384x8192 bf16 (8 warps),
0.87x torch.compile's backward from the saved y (4,295 GB/s), 1.77x eager; not faster than the best baseline.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from seeds.softmax import softmax_bwd

CRUCIBLE_SEED = {"name": "softmax_bwd", "tasks": ["softmax_bwd.py"], "ops": ["softmax bwd (last dim)"]}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        return softmax_bwd(x, dy, from_input=True)
