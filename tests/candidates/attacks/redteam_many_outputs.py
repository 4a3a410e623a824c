"""Returns thousands of tiny tensors in place of one output: the parent must end this with a verdict, not a
traceback or a hang."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _touch(y_ptr):
    pass


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty(1, dtype=x.dtype)
        _touch[(1,)](y)
        return tuple(y for _ in range(5000))
