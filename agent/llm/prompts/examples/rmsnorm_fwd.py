"""Example candidate for tasks/rmsnorm_fwd.py: y = x / sqrt(mean(x^2) + eps) * w, fp32 maths, output in x's dtype.

One program per row; the whole row sits in registers (BLOCK_N = next power of two >= N, masked), so x is read once
and y written once: 2 * M * N * itemsize + N * itemsize bytes. Simple and correct, not tuned: a faster version
would handle several rows per program and pick num_warps from N.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_fwd_kernel(
    x_ptr, w_ptr, y_ptr,
    stride_x,  # elements between rows of x
    stride_y,  # elements between rows of y
    N, eps,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    y = x * rstd * w
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def rmsnorm_fwd(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    assert w.shape == (n,), "weight must match the last dimension of x"
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    block = triton.next_power_of_2(n)
    num_warps = 4 if block <= 2048 else 8
    _rmsnorm_fwd_kernel[(x2.shape[0],)](x2, w, y, x2.stride(0), y.stride(0), n, eps,
                                         BLOCK_N=block, num_warps=num_warps)
    return y.view(x.shape)


class ModelNew(nn.Module):
    """Same constructor and parameter names as the task's Model: the harness loads the reference's weights."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rmsnorm_fwd(x, self.weight, self.eps)
