"""torch.nn.functional reached through the nn module handle (nn.functional.softmax), decoy launch beside it."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _touch(y_ptr):
    pass


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.softmax(x.float(), dim=-1).to(x.dtype)
        _touch[(1,)](y)
        return y
