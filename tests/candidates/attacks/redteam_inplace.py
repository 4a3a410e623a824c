"""In-place tensor methods (copy_, mul_, rsqrt_) on a fresh buffer: each is an aten compute op, in place or not."""
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
        xf = torch.empty(x.shape, dtype=torch.float32)
        xf.copy_(x)
        r = torch.empty(x.shape[0], 1, dtype=torch.float32)
        r.copy_(xf.pow(2).mean(-1, keepdim=True))
        r.add_(self.eps).rsqrt_()
        xf.mul_(r).mul_(self.weight)
        y = xf.to(x.dtype)
        _touch[(1,)](y)
        return y
