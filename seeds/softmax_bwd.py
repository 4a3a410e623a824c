"""Softmax backward task seed: (x, dy) -> dx through the kernel of seeds/softmax.py, recomputing y from x in registers.

One pass: read x and dy, write dx. Bytes (bf16, 16384x8192): 3·M·N·2 = 805 MB.

Measured on the H200 (docs/bench-norms.md): 0.2164 ms = 3,721 GB/s at 16384x8192 bf16 (8 warps),
0.87x torch.compile's backward from the saved y (4,295 GB/s), 1.77x eager; not faster than the best baseline.

Variants (`RowVariant`, default off, timed by benchmarks/sweep_norms.py, not yet measured on the GPU): a
one-row kernel, from x or from the saved y, a 1-D block at a scalar row offset with no mask at all when N is the
block (the task's 8192). What each option changes, and what compiling for sm_90 here showed (triton 3.6 and ptxas,
no GPU; registers a thread, SASS instructions of the kernel):
- from y at 16 warps: 46 registers / 216 instructions against the seed's 48 / 216, so the 1-D form alone changes
  little; from x at 8 warps the two sums of a row (sum e and sum e·dy) share one reduction and y is never formed,
  dx = e/s · (dy - d/s) with s = sum e, d = sum e·dy: 576 instructions and 6 barriers against 680 and 8;
- memory hints: `evict_first` on the once-read loads, `.cs` (streaming) on the dx store (the forwards' sweep,
  found evict_first 2.7-4.5% slower and .cs neutral there);
- a persistent grid (k programs per SM walking rows with a stride), optionally loading the next row before this
  row's arithmetic so a program keeps a row of loads in flight (64 registers from y at 16 warps: 2 programs per
  SM; 128 from x at 8 warps: 1). A prefetch past the last row re-reads row M - 1 instead (no out-of-bounds read;
  the interpreter cannot tell the two apart, so only the GPU run exercises it);
- from y only, `chunk`: two passes over the row in chunks, the second re-reading the row from cache, as
  torch.compile's looped reduction does (its backward is the one the seed trails);
- `maxnreg`: a register cap. Liger's backward holds 32 registers at 16 warps (4 programs per SM, twice the rows in
  flight of the seed's 2) because it does its arithmetic in bf16; fp32 arithmetic on 8192 columns does not fit 32
  without spilling (48 bytes a thread), 40 (3 programs per SM) spills 8.
`_load` / `_store` / `load_row_pair` / `store_row` / `RowVariant` are shared with seeds/rmsnorm_residual.py.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl

from seeds._common import RowVariant, as_rows, load_cols, load_row_pair, row_block, store_cols, store_row
from seeds.softmax import softmax_bwd

CRUCIBLE_SEED = {"name": "softmax_bwd", "tasks": ["softmax_bwd.py"], "ops": ["softmax bwd (last dim)"]}

@triton.jit
def _add_pair(a, b, c, d):
    return a + c, b + d


@triton.jit
def _softmax_bwd_row_kernel(
    S, DY, DX,  # S: the saved output y, or the input x when FROM_INPUT
    M, N,
    stride_s, stride_dy, stride_dx,  # elements between rows
    FROM_INPUT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr,       # N == BLOCK_N: no masks
    LOAD_POLICY: tl.constexpr,
    STORE_CACHE: tl.constexpr,
    PREFETCH: tl.constexpr,     # issue the next row's loads before this row's arithmetic (persistent grids)
):
    # dx = y * (dy - sum(dy * y)). From x, with e = exp(x - max x), s = sum e and d = sum e * dy (one reduction):
    # y = e / s and sum(dy * y) = d / s, so dx = e/s * (dy - d/s).
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    if PREFETCH:
        s_next, dy_next = load_row_pair(S, DY, pid, stride_s, stride_dy, M, N, cols, EVEN_N, True, LOAD_POLICY)
    for row in range(pid, M, step):
        if PREFETCH:
            s, dy = s_next, dy_next
            s_next, dy_next = load_row_pair(S, DY, row + step, stride_s, stride_dy, M, N, cols, EVEN_N, True,
                                             LOAD_POLICY)
        else:
            s, dy = load_row_pair(S, DY, row, stride_s, stride_dy, M, N, cols, EVEN_N, False, LOAD_POLICY)
        s = s.to(tl.float32)
        dy = dy.to(tl.float32)
        if FROM_INPUT:
            if not EVEN_N:
                s = tl.where(cols < N, s, float("-inf"))
            e = tl.exp2((s - tl.max(s, axis=0)) * 1.4426950408889634)
            total, dot = tl.reduce((e, e * dy), 0, _add_pair)
            inv = 1.0 / total
            dx = e * inv * (dy - dot * inv)
        else:
            dx = s * (dy - tl.sum(s * dy, axis=0))
        store_row(DX, row, stride_dx, N, cols, dx, EVEN_N, STORE_CACHE)


@triton.jit
def _softmax_bwd_two_pass_kernel(
    Y, DY, DX,
    N,
    stride_y, stride_dy, stride_dx,
    CHUNK: tl.constexpr,        # columns per step
    EVEN_N: tl.constexpr,       # N % CHUNK == 0: no masks
    STORE_CACHE: tl.constexpr,
):
    # Pass 1 adds y * dy chunk by chunk into a CHUNK-wide accumulator (one cross-warp reduction at the end) and asks
    # the cache to keep the row; pass 2 re-reads it (from L1/L2, not HBM) and writes dx.
    row = tl.program_id(0).to(tl.int64)
    y_row, dy_row, dx_row = Y + row * stride_y, DY + row * stride_dy, DX + row * stride_dx
    cols = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    for start in range(0, N, CHUNK):
        y = load_cols(y_row + start + cols, start + cols, N, EVEN_N, "evict_last")
        dy = load_cols(dy_row + start + cols, start + cols, N, EVEN_N, "evict_last")
        acc += y.to(tl.float32) * dy.to(tl.float32)
    dot = tl.sum(acc, axis=0)
    for start in range(0, N, CHUNK):
        y = load_cols(y_row + start + cols, start + cols, N, EVEN_N, "evict_first")
        dy = load_cols(dy_row + start + cols, start + cols, N, EVEN_N, "evict_first")
        dx = y.to(tl.float32) * (dy.to(tl.float32) - dot)
        store_cols(dx_row + start + cols, dx.to(DX.dtype.element_ty), start + cols, N, EVEN_N, STORE_CACHE)


def softmax_bwd_rows(saved: torch.Tensor, dy: torch.Tensor, *, from_input: bool,
                     variant: RowVariant = RowVariant()) -> torch.Tensor:
    """dx of y = softmax(x, -1) for the upstream gradient dy (`saved` is y, or x when `from_input`), through the
    one-row kernels of this file, launched as `variant` says."""
    if not (saved.is_floating_point() and dy.is_floating_point()):
        raise TypeError(f"softmax backward needs floating tensors, got {saved.dtype} and {dy.dtype}")
    if dy.shape != saved.shape or dy.device != saved.device:
        raise ValueError(f"dy {tuple(dy.shape)} on {dy.device} does not match {tuple(saved.shape)} on {saved.device}")
    if variant.chunk and from_input:
        raise ValueError("the two-pass (chunk) kernel reads the saved y; from x it would compute exp twice")
    s2, dy2 = as_rows(saved), as_rows(dy)
    m, n = s2.shape
    dx = torch.empty(s2.shape, dtype=saved.dtype, device=saved.device)
    if not s2.numel():
        return dx.view(saved.shape)
    block = row_block(n)
    if variant.chunk:
        chunk = min(variant.chunk, block)
        _softmax_bwd_two_pass_kernel[(m,)](
            s2, dy2, dx, n, s2.stride(0), dy2.stride(0), dx.stride(0),
            CHUNK=chunk, EVEN_N=n % chunk == 0, STORE_CACHE=variant.store_cache,
            **variant.launch_options(chunk, saved.element_size()),
        )
    else:
        _softmax_bwd_row_kernel[(variant.grid(m, saved.device),)](
            s2, dy2, dx, m, n, s2.stride(0), dy2.stride(0), dx.stride(0),
            FROM_INPUT=from_input, BLOCK_N=block, EVEN_N=n == block, LOAD_POLICY=variant.load_policy,
            STORE_CACHE=variant.store_cache, PREFETCH=variant.prefetch,
            **variant.launch_options(block, saved.element_size()),
        )
    return dx.view(saved.shape)


class ModelNew(nn.Module):
    """The task contract. `variant=None` (the default) is seeds/softmax.py's backward; a RowVariant picks the
    one-row kernel of this file."""

    def __init__(self, variant: RowVariant | None = None):
        super().__init__()
        self.variant = variant

    def forward(self, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        if self.variant is None:
            return softmax_bwd(x, dy, from_input=True)
        return softmax_bwd_rows(x, dy, from_input=True, variant=self.variant)
