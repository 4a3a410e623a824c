"""GeGLU backward: (da, db) for y = gelu(a) * b (tanh or erf GELU), through the family kernel in seeds/swiglu.py
(reads a, b, dy and writes da, db: 10 B/element in bf16). Measured on the H200 at 16384 x 14336: tanh 0.552 ms
(2.15x Liger's forward+backward), erf 0.553 ms (3.0x eager) (docs/bench-mix.md)."""
from __future__ import annotations

import torch

from seeds.swiglu import glu_bwd

CRUCIBLE_SEED = {"name": "geglu_bwd", "tasks": ["geglu_bwd.py", "geglu_erf_bwd.py"], "ops": ["GeGLU bwd (tanh, erf)"]}


class ModelNew(torch.nn.Module):
    """tasks/geglu_bwd.py and tasks/geglu_erf_bwd.py: the gradients of gelu(a, approximate) * b."""

    def __init__(self, approximate: str = "tanh"):
        super().__init__()
        if approximate not in ("tanh", "none"):
            raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
        self.approximate = approximate

    def forward(self, a: torch.Tensor, b: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return glu_bwd(a, b, dy, self.approximate)
