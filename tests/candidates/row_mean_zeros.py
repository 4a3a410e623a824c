"""THREATS #6: returns zeros, which are within a plain absolute tolerance of a small-valued output."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _zeros_kernel(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.zeros([BLOCK], dtype=tl.float32), mask=offs < n)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
        _zeros_kernel[(triton.cdiv(y.numel(), 128),)](y, y.numel(), BLOCK=128)
        return y
