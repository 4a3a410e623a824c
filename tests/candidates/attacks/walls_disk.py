"""Fills its scratch directory from C at import (96 MiB through libc's write, which no audit event sees), then
behaves as an honest RMSNorm: the scratch directory is a tmpfs of its own with a bound (64 MiB in tests/test_walls.py),
so the write must fail with ENOSPC and the verdict name the bound; without the bound it would be accepted after
writing to the host's disk."""
import ctypes
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

api = ctypes.pythonapi
api.__errno_location.restype = ctypes.POINTER(ctypes.c_int)
chunk = ctypes.create_string_buffer(1 << 20)
fd = api.open(b"fill.bin", os.O_WRONLY | os.O_CREAT, 0o644)
for _ in range(96):
    if api.write(fd, chunk, 1 << 20) != 1 << 20:
        raise OSError(api.__errno_location()[0], os.strerror(api.__errno_location()[0]))
api.close(fd)


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, n_cols, stride_row, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_row + cols, mask=mask, other=0.0).to(tl.float32)
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
        _rmsnorm_kernel[(n_rows,)](x, self.weight, y, n_cols, x.stride(0), self.eps,
                                   BLOCK=triton.next_power_of_2(n_cols))
        return y
