"""GeGLU forward: y = gelu(a) * b with GELU in its tanh form (Gemma) or its exact erf form, through the family
kernel in seeds/swiglu.py (reads a, b and writes y: 6 B/element in bf16). Measured on the H200 at 16384 x 14336:
tanh 0.328 ms = 4,296 GB/s (1.65x Liger), erf 0.356 ms = 3,955 GB/s (1.75x eager) (docs/bench-mix.md)."""
from __future__ import annotations

import torch

from seeds.swiglu import glu_fwd

CRUCIBLE_SEED = {"name": "geglu", "tasks": ["geglu_fwd.py", "geglu_erf_fwd.py"], "ops": ["GeGLU fwd (tanh, erf)"]}


class ModelNew(torch.nn.Module):
    """tasks/geglu_fwd.py and tasks/geglu_erf_fwd.py: gelu(a, approximate) * b."""

    def __init__(self, approximate: str = "tanh"):
        super().__init__()
        if approximate not in ("tanh", "none"):
            raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
        self.approximate = approximate

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return glu_fwd(a, b, self.approximate)
