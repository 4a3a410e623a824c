"""Right outputs on every call, but from its (N+1)th call on the kernel also writes into its input (in place), with
its counter out of the walk of the model's state (inside an lru_cache): only the input checks of calls it cannot
count catch it (the soak's, which always include its verified calls)."""
import functools

import torch
import torch.nn as nn
import triton
import triton.language as tl

N = 8
_box = functools.lru_cache(maxsize=None)(lambda: {"calls": 0})


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, n_cols, stride_row, eps, SPOIL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_row + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    y = x * rstd * w
    tl.store(y_ptr + row * stride_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    if SPOIL:
        tl.store(x_ptr + row * stride_row + cols, y.to(x_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        box = _box()
        box["calls"] += 1
        y = torch.empty_like(x)
        _rmsnorm_kernel[(x.shape[0],)](x, self.weight, y, x.shape[1], x.stride(0), self.eps, SPOIL=box["calls"] > N,
                                       BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
