"""Fused residual add + RMSNorm forward seed: (x, residual) -> (rmsnorm(x + residual) * w, x + residual).

One pass: read x and residual, write the rounded sum h and the normalised y (the kernel of seeds/rmsnorm.py with
HAS_RESIDUAL). Bytes (bf16, 16384x4096): 4·M·N·2 = 537 MB.

Measured on the H200 (docs/bench-norms.md): 0.1432 ms = 3,749 GB/s (88% of copy) at 16384x4096 bf16,
0.96x Liger's fused_add_rms_norm (3,918) and 0.97x torch.compile (3,881); 1.26x eager.

Variants (a `RowVariant` of seeds/softmax_bwd.py, default off, timed by benchmarks/sweep_norms.py, not yet
measured on the GPU): a one-row kernel shaped like Liger's (a 1-D block at a scalar row offset, no mask when N is the
block), with the memory hints (`evict_first` loads of x and residual, `.cs` streaming stores of h and y), a
persistent grid (optionally with the next row's loads issued before this row's arithmetic) and a register cap.
Compiled for sm_90 here (triton 3.6, ptxas), the 8-warp row kernel has the seed kernel's counts (40 registers a
thread, 264 SASS instructions) and Liger's holds 40 registers too (320 instructions): occupancy does not explain the
4% between them, so only the GPU sweep can say whether any of these launch shapes closes it.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl

from seeds._common import RowVariant, as_rows, load_cols, load_row_pair, row_block, store_row
from seeds.rmsnorm import _check, rmsnorm_residual_fwd

CRUCIBLE_SEED = {"name": "rmsnorm_residual", "tasks": ["rmsnorm_residual_fwd.py"],
                 "ops": ["residual add + RMSNorm fwd"]}


@triton.jit
def _add_rmsnorm_row_kernel(
    X, R, W, Y, H,  # R: residual; H: x + residual, rounded to H's dtype (the new residual stream)
    M, N,
    stride_x, stride_r, stride_y, stride_h,  # elements between rows
    eps,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr,       # N == BLOCK_N: no masks
    LOAD_POLICY: tl.constexpr,  # eviction policy of the x and residual loads
    STORE_CACHE: tl.constexpr,  # cache modifier of the h and y stores
    PREFETCH: tl.constexpr,     # issue the next row's loads before this row's arithmetic (persistent grids)
):
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    if PREFETCH:
        x_next, r_next = load_row_pair(X, R, pid, stride_x, stride_r, M, N, cols, EVEN_N, True, LOAD_POLICY)
    for row in range(pid, M, step):
        if PREFETCH:
            x, r = x_next, r_next
            x_next, r_next = load_row_pair(X, R, row + step, stride_x, stride_r, M, N, cols, EVEN_N, True,
                                            LOAD_POLICY)
        else:
            x, r = load_row_pair(X, R, row, stride_x, stride_r, M, N, cols, EVEN_N, False, LOAD_POLICY)
        # The sum is rounded to the activation dtype first, as the unfused model does; the norm reads that value.
        h = (x.to(tl.float32) + r.to(tl.float32)).to(H.dtype.element_ty)
        store_row(H, row, stride_h, N, cols, h, EVEN_N, STORE_CACHE)
        h = h.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(h * h, axis=0) / N + eps)
        # w (N elements, read by every row) is loaded per row from L1/L2 rather than held across the loop: the
        # registers it would hold are worth more as loads in flight.
        w = load_cols(W + cols, cols, N, EVEN_N, "evict_last").to(tl.float32)
        store_row(Y, row, stride_y, N, cols, h * rstd * w, EVEN_N, STORE_CACHE)


def rmsnorm_residual_rows(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float,
                          variant: RowVariant = RowVariant()) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x + residual) * w, x + residual) through the one-row kernel of this file, launched as `variant`
    says; the same contract as seeds.rmsnorm.rmsnorm_residual_fwd."""
    _check(x, w)
    if residual.shape != x.shape or residual.device != x.device:
        raise ValueError(f"residual {tuple(residual.shape)} on {residual.device} does not match x "
                         f"{tuple(x.shape)} on {x.device}")
    if variant.chunk:
        raise ValueError("the fused residual RMSNorm keeps its row in registers: chunk must be 0")
    x2, r2 = as_rows(x), as_rows(residual)
    m, n = x2.shape
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    h = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.numel():
        block = row_block(n)
        _add_rmsnorm_row_kernel[(variant.grid(m, x.device),)](
            x2, r2, w, y, h, m, n, x2.stride(0), r2.stride(0), y.stride(0), h.stride(0), eps,
            BLOCK_N=block, EVEN_N=n == block, LOAD_POLICY=variant.load_policy, STORE_CACHE=variant.store_cache,
            PREFETCH=variant.prefetch, **variant.launch_options(block, x.element_size()),
        )
    return y.view(x.shape), h.view(x.shape)


class ModelNew(nn.Module):
    """The task contract. `variant=None` (the default) is seeds/rmsnorm.py's fused kernel; a RowVariant picks the
    one-row kernel of this file."""

    def __init__(self, hidden: int, eps: float, variant: RowVariant | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.eps = eps
        self.variant = variant

    def forward(self, x: torch.Tensor, residual: torch.Tensor):
        if self.variant is None:
            return rmsnorm_residual_fwd(x, residual, self.weight, self.eps)
        return rmsnorm_residual_rows(x, residual, self.weight, self.eps, self.variant)
