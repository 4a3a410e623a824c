"""Hangs in a Triton kernel: its loop never ends (a Python loop under the interpreter, a spinning GPU kernel)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_spin_kernel(x_ptr, w_ptr, y_ptr, n_cols, stride_row, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_row + cols, mask=mask, other=0.0).to(tl.float32)
    i = 1
    while i > 0:  # i never changes
        # the load is volatile, so the GPU compiler cannot prove the loop ends and remove it
        i = i * 1 + (tl.load(x_ptr + row * stride_row, volatile=True) * 0.0).to(tl.int32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(y_ptr + row * stride_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n_rows, n_cols = x.shape
        _rmsnorm_spin_kernel[(n_rows,)](x, self.weight, y, n_cols, x.stride(0), self.eps,
                                        BLOCK=triton.next_power_of_2(n_cols))
        return y
