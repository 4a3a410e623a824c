"""A kernel body that never ends: on the interpreter it is a Python loop; the check must end at its timeout."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _touch(y_ptr):
    pass


@triton.jit
def _spin(y_ptr, n):
    i = 0
    while i < n:
        i = i * 1


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        _spin[(1,)](y, 5)
        return y
