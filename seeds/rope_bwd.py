"""RoPE backward: the gradients of q and k, the transposed rotation of dq and dk in one launch, through the kernel in
seeds/rope.py (reads dq, dk and writes their rotations: the forward's bytes). Measured on the H200: 0.089 ms = 3,800 GB/s, 8.2x
Liger's and torch.compile's forward+backward (docs/bench-mix.md)."""
from __future__ import annotations

import torch

from seeds.rope import rope

CRUCIBLE_SEED = {"name": "rope_bwd", "tasks": ["rope_bwd.py"], "ops": ["RoPE bwd (Llama layout, GQA)"]}


class ModelNew(torch.nn.Module):
    """tasks/rope_bwd.py: (dq, dk) -> gradients of q and k."""

    def forward(self, q, k, cos, sin, dq, dk):
        return rope(dq, dk, cos, sin, backward=True)
