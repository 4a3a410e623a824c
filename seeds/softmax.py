"""Softmax over the last dimension, forward and backward.

    y = exp(x - max(x)) / sum(exp(x - max(x)))            (per row, fp32 arithmetic, y in x's dtype)
    dx = y * (dy - sum(dy * y))

x is (..., N) in fp32/fp16/bf16. Up to N = 65536 each row is held whole in registers: one read, one write. Wider rows
(KernelBench's softmax has 393,216 columns) take a chunked forward: an online max/sum pass, then a normalising pass
(two reads, one write). Bytes at the
task shape (bf16, M=16384, N=8192): forward 2·M·N·2 = 537 MB; backward (read y or x, dy; write dx) 805 MB.

The backward kernel takes either the saved output y (training: autograd keeps y, as PyTorch does) or the input x, from
which it recomputes y in registers (the backward task hands it x): the same bytes either way.

Measured on the H200 (torch 2.11, triton 3.6), bf16 16384x8192:
  forward (`crucible bench`, docs/results.md, after the loads lost their evict_first hint, which cost
  4.5%): 0.1315 ms = 4,084 GB/s (98% of roofline), 3.8x torch.softmax, 2.35x compile, 0.999x Liger [0.995, 1.004]:
  no significant difference;
  backward from y (docs/bench-norms.md, with the hints; not re-measured without them): 0.2035 ms = 3,958 GB/s,
  0.92x torch.compile (4,295) and 0.94x Liger (4,227), 1.9x eager.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl

from seeds._common import MAX_ROW_BLOCK, as_rows, row_block, row_warps

LOG2E = tl.constexpr(1.4426950408889634)
WIDE_BLOCK = 4096  # columns per chunk of a row too wide for registers


@triton.jit
def _row_softmax(x, col_ok):
    # x: (ROWS, BLOCK_N) fp32; columns past N are ignored. Rows that are all -inf give NaN, as torch.softmax does.
    x = tl.where(col_ok[None, :], x, float("-inf"))
    e = tl.exp2((x - tl.max(x, axis=1)[:, None]) * 1.4426950408889634)
    return e / tl.sum(e, axis=1)[:, None]


@triton.jit
def _softmax_fwd_kernel(
    X, Y,
    M, N,
    stride_x, stride_y,  # elements between rows
    ROWS: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows[:, None] < M) & col_ok[None, :]
    rows = rows.to(tl.int64)[:, None]
    x = tl.load(X + rows * stride_x + cols[None, :], mask=mask, other=0.0)
    y = _row_softmax(x.to(tl.float32), col_ok)
    tl.store(Y + rows * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_fwd_wide_kernel(
    X, Y,
    N,
    stride_x, stride_y,  # elements between rows
    BLOCK_N: tl.constexpr,  # columns per chunk
):
    # One row per program. Pass 1 keeps, per lane, the running max m and the sum s of exp(x - m) over the chunks seen,
    # rescaling s by exp(m_old - m_new) when m grows; lanes that have seen only -inf hold s = 0. Pass 2 writes
    # exp(x - M) / S with the row's M and S combined from the lanes. A row of -inf gives NaN, as torch.softmax does.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    m = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK_N,), tl.float32)
    for start in range(0, N, BLOCK_N):
        ok = start + cols < N
        x = tl.load(X + row * stride_x + start + cols, mask=ok, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        seen = m_new != float("-inf")
        alpha = tl.where(seen, tl.exp2((m - m_new) * LOG2E), 0.0)
        p = tl.where(seen, tl.exp2((x - m_new) * LOG2E), 0.0)
        s = s * alpha + p
        m = m_new
    row_max = tl.max(m, axis=0)
    row_sum = tl.sum(tl.where(m != float("-inf"), s * tl.exp2((m - row_max) * LOG2E), 0.0), axis=0)
    row_sum = tl.where(row_max == float("-inf"), float("nan"), row_sum)
    for start in range(0, N, BLOCK_N):
        ok = start + cols < N
        x = tl.load(X + row * stride_x + start + cols, mask=ok, other=0.0).to(tl.float32)
        y = tl.exp2((x - row_max) * LOG2E) / row_sum
        tl.store(Y + row * stride_y + start + cols, y.to(Y.dtype.element_ty), mask=ok)


@triton.jit
def _softmax_bwd_kernel(
    S, DY, DX,  # S: the saved output y, or the input x when FROM_INPUT
    M, N,
    stride_s, stride_dy, stride_dx,
    FROM_INPUT: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # dy_i/dx_j = y_i (delta_ij - y_j), so dx_j = sum_i dy_i y_i (delta_ij - y_j) = y_j * (dy_j - sum_i dy_i y_i).
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows[:, None] < M) & col_ok[None, :]
    rows = rows.to(tl.int64)[:, None]
    s = tl.load(S + rows * stride_s + cols[None, :], mask=mask, other=0.0)
    dy = tl.load(DY + rows * stride_dy + cols[None, :], mask=mask, other=0.0)
    s = s.to(tl.float32)
    if FROM_INPUT:
        y = _row_softmax(s, col_ok)
    else:
        y = s
    dy = dy.to(tl.float32)
    dx = y * (dy - tl.sum(dy * y, axis=1)[:, None])
    tl.store(DX + rows * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)


# ---- launchers ------------------------------------------------------------------------------------------------------

def fwd_config(n: int, elem_bytes: int) -> tuple[int, int]:
    """(rows per program, warps) for the forward: one row per program, about 1 KiB of row per warp."""
    return 1, row_warps(row_block(n), elem_bytes)


def bwd_config(n: int, elem_bytes: int, from_input: bool) -> tuple[int, int]:
    """(rows per program, warps) for the backward. Recomputing y (exp per element) wants more rows in flight per SM:
    on the H200 at 16384x8192 bf16, 8 warps reached 3,721 GB/s against 3,398 with 16; from y, 16 warps gave 3,958."""
    warps = row_warps(row_block(n), elem_bytes)
    return 1, max(4, warps // 2) if from_input else warps


def softmax_fwd(x: torch.Tensor, *, rows: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """softmax(x, dim=-1) in x's dtype."""
    if not x.is_floating_point():
        raise TypeError(f"softmax needs a floating tensor, got {x.dtype}")
    x2 = as_rows(x)
    m, n = x2.shape
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.numel() and n > MAX_ROW_BLOCK:
        _softmax_fwd_wide_kernel[(m,)](x2, y, n, x2.stride(0), y.stride(0), BLOCK_N=WIDE_BLOCK,
                                       num_warps=num_warps or 8)
    elif x2.numel():
        d_rows, d_warps = fwd_config(n, x.element_size())
        rows = rows or d_rows
        _softmax_fwd_kernel[(triton.cdiv(m, rows),)](
            x2, y, m, n, x2.stride(0), y.stride(0),
            ROWS=rows, BLOCK_N=row_block(n), num_warps=num_warps or d_warps,
        )
    return y.view(x.shape)


def softmax_bwd(saved: torch.Tensor, dy: torch.Tensor, *, from_input: bool, rows: int | None = None,
                num_warps: int | None = None) -> torch.Tensor:
    """dx of y = softmax(x, -1) for the upstream gradient dy; `saved` is y, or x when `from_input`."""
    if not (saved.is_floating_point() and dy.is_floating_point()):
        raise TypeError(f"softmax backward needs floating tensors, got {saved.dtype} and {dy.dtype}")
    if dy.shape != saved.shape or dy.device != saved.device:
        raise ValueError(f"dy {tuple(dy.shape)} on {dy.device} does not match {tuple(saved.shape)} on {saved.device}")
    s2, dy2 = as_rows(saved), as_rows(dy)
    m, n = s2.shape
    dx = torch.empty(s2.shape, dtype=saved.dtype, device=saved.device)
    if s2.numel():
        d_rows, d_warps = bwd_config(n, saved.element_size(), from_input)
        rows = rows or d_rows
        _softmax_bwd_kernel[(triton.cdiv(m, rows),)](
            s2, dy2, dx, m, n, s2.stride(0), dy2.stride(0), dx.stride(0),
            FROM_INPUT=from_input, ROWS=rows, BLOCK_N=row_block(n), num_warps=num_warps or d_warps,
        )
    return dx.view(saved.shape)


class SoftmaxFunction(torch.autograd.Function):
    """softmax over the last dimension with the Triton backward; saves y, as PyTorch does."""

    @staticmethod
    def forward(ctx, x):
        y = softmax_fwd(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return softmax_bwd(y, dy, from_input=False)


CRUCIBLE_SEED = {"name": "softmax", "tasks": ["softmax_fwd.py", "23_Softmax.py"], "ops": ["softmax fwd (last dim)"]}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return SoftmaxFunction.apply(x)
