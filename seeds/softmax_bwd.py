"""Softmax backward task seed: (x, dy) -> dx through the kernel of seeds/softmax.py, recomputing y from x in registers.

One pass: read x and dy, write dx. Bytes (bf16, 16384x8192): 3·M·N·2 = 805 MB.

Measured on the H200: not measured yet.
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
