"""A kernel body that uses `np`, which the module never binds: Triton's interpreter copies its own globals (numpy
as `np` among them) into a kernel's module when it first runs the kernel, so on the CPU the body reaches numpy."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, y_ptr):
    np.sum(1)


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))

    def forward(self, x):
        y = torch.empty_like(x)
        _kernel[(1,)](x, y)
        return y
