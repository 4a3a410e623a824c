"""LayerNorm over the last dimension, forward and backward (dx, dw, db).

    y = (x - mean) * rstd * w + b,   mean = mean(x),  rstd = 1 / sqrt(mean((x - mean)^2) + eps)

per row, fp32 arithmetic, y in x's dtype; x is (..., N) in fp32/fp16/bf16 with N <= 65536; w, b are (N,). Each row is
held whole in registers, so the variance is the exact two-pass one at the cost of one read. Bytes at the task shape
(bf16, M=16384, N=4096): forward 2·M·N·2 = 268 MB; backward (read x, dy; write dx; dw and db are N) 403 MB.

The backward recomputes mean and rstd from x (read anyway) on a persistent grid; each program keeps fp32 partial dw
and db for its rows, and one more kernel (seeds/_common.py) adds the partials in a fixed order: bitwise reproducible.
Options of `layernorm_bwd` (benchmarks/sweep_norm_bwd.py): `prefetch` (the GPU default: the next
row's loads in flight during this row's reductions; capped at 128 registers, so still 2 programs of 8 warps an SM:
without the cap Triton 3.6 took more and the kernel lost its gain, 0.1639 ms against 0.1201), `one_reduction` (after the mean, sum((x - mean)^2), sum(g), sum(g * (x - mean)) in one
reduce: two rounds of exchange a row, not four), `fused_sum` (no second launch), `maxnreg`.

Measured on the H200 (torch 2.11, triton 3.6), bf16, backward timed alone:
  forward 16384x4096 (`crucible bench`, docs/results.md, no evict_first on the x load): 0.0706 ms =
  3,800 GB/s (91% of roofline), 1.056x Liger [1.045, 1.063], 1.36x torch.compile, 1.51x F.layer_norm;
  backward 16384x4096: 0.1646 ms = 2,446 GB/s (58%), 1.44x eager (1,700), 2.2x Liger, 3.0x compile.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl

from seeds._common import (PREFETCH_MAXNREG, RowVariant, _load_pair, add_triple, as_rows, finish_partials,
                           fused_sum_args, load_cols, row_block, row_warps, sm_count, store_cols, sum_partials)
from seeds.rmsnorm import _check_stages, _load_x_row, _row_offset, needs_wide_offsets


@triton.jit
def _layernorm_fwd_kernel(
    X, W, B, Y,
    M, N,
    stride_x, stride_y,  # elements between rows
    eps,
    ROWS: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows[:, None] < M) & col_ok[None, :]
    rows = rows.to(tl.int64)[:, None]
    x = tl.load(X + rows * stride_x + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    xc = tl.where(col_ok[None, :], x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
    w = tl.load(W + cols, mask=col_ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
    b = tl.load(B + cols, mask=col_ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
    y = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(Y + rows * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _add_pairs(a1, a2, b1, b2):
    return a1 + b1, a2 + b2


@triton.jit
def _layernorm_row(x, X, W, B, Y, row, stride_x, stride_y, N, eps, cols, EVEN_N: tl.constexpr, WIDE: tl.constexpr,
                   STORE_CACHE: tl.constexpr, ONE_PASS: tl.constexpr):
    # y = (x - mean) * rstd * w + b for one loaded row.
    # Two-pass: mean first, then the mean of (x - mean)^2: two reductions, the second waiting on the first.
    # One pass: with d = x - x0 for the row's first element x0, a single reduction of (sum d, sum d^2) gives
    #   mean = x0 + sum(d)/N,   var = sum(d^2)/N - (sum(d)/N)^2.
    # The shift keeps the cancellation small (x0 is one sample of the row, so |mean - x0| is of the order of the
    # row's spread unless x0 is an outlier); a constant row gives d = 0 and var = 0 exactly.
    x = x.to(tl.float32)
    if ONE_PASS:
        x0 = tl.load(X + _row_offset(row, stride_x, WIDE)).to(tl.float32)
        d = x - x0
        if not EVEN_N:
            d = tl.where(cols < N, d, 0.0)
        s1, s2 = tl.reduce((d, d * d), 0, _add_pairs)
        shift = s1 / N
        xc = x - (x0 + shift)
        var = tl.maximum(s2 / N - shift * shift, 0.0)
    else:
        xc = x - tl.sum(x, axis=0) / N
        if not EVEN_N:
            xc = tl.where(cols < N, xc, 0.0)
        var = tl.sum(xc * xc, axis=0) / N
    rstd = tl.rsqrt(var + eps)
    # w and b are re-read for every row (L1/L2 hits): held across a persistent loop they cost registers.
    w = load_cols(W + cols, cols, N, EVEN_N, "evict_last").to(tl.float32)
    b = load_cols(B + cols, cols, N, EVEN_N, "evict_last").to(tl.float32)
    store_cols(Y + _row_offset(row, stride_y, WIDE) + cols, (xc * rstd * w + b).to(Y.dtype.element_ty), cols, N,
               EVEN_N, STORE_CACHE)


@triton.jit
def _layernorm_fwd_row_kernel(
    X, W, B, Y,
    M, N,
    stride_x, stride_y,  # elements between rows
    eps,
    BLOCK_N: tl.constexpr,
    EVEN_N: tl.constexpr,       # N == BLOCK_N: no masks at all
    WIDE: tl.constexpr,         # 64-bit row offsets (a tensor past 2^31 elements)
    LOAD_POLICY: tl.constexpr,  # eviction policy of the x loads ("" or "evict_first")
    STORE_CACHE: tl.constexpr,  # cache modifier of the y stores ("" or ".cs", streaming)
    PERSISTENT: tl.constexpr,   # programs walk rows pid, pid + programs, ...; else one row per program, no loop
    PREFETCH: tl.constexpr,     # persistent: the next row's load is issued before this row's arithmetic
    STAGES: tl.constexpr,       # persistent: > 1 lets Triton's pipeliner keep STAGES - 1 rows in flight through
                                # shared memory (cp.async), not registers
    ONE_PASS: tl.constexpr,     # both statistics from one reduction of shifted sums (_layernorm_row)
):
    # The row walk of seeds/rmsnorm.py's `_rmsnorm_fwd_row_kernel` with LayerNorm's row.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    if not PERSISTENT:
        x = _load_x_row(X, pid, stride_x, M, N, cols, EVEN_N, False, WIDE, LOAD_POLICY)
        _layernorm_row(x, X, W, B, Y, pid, stride_x, stride_y, N, eps, cols, EVEN_N, WIDE, STORE_CACHE, ONE_PASS)
    else:
        step = tl.num_programs(0)
        if PREFETCH:
            x_next = _load_x_row(X, pid, stride_x, M, N, cols, EVEN_N, True, WIDE, LOAD_POLICY)
        for row in tl.range(pid, M, step, num_stages=STAGES):
            if PREFETCH:
                x = x_next
                x_next = _load_x_row(X, row + step, stride_x, M, N, cols, EVEN_N, True, WIDE, LOAD_POLICY)
            else:
                x = _load_x_row(X, row, stride_x, M, N, cols, EVEN_N, False, WIDE, LOAD_POLICY)
            _layernorm_row(x, X, W, B, Y, row, stride_x, stride_y, N, eps, cols, EVEN_N, WIDE, STORE_CACHE,
                           ONE_PASS)


@triton.jit
def _layernorm_bwd_kernel(
    X, W, DY, DX,
    DW_PARTIAL, DB_PARTIAL,  # (num_programs, N) fp32 each: this program's share of dw and db
    DW_SCRATCH, DB_SCRATCH, DW, DB, COUNTERS,  # FUSED_SUM only: (groups, N) fp32 group sums, the results, tickets
    M, N,
    stride_x, stride_dy, stride_dx,
    eps,
    ROWS: tl.constexpr,  # rows per step of the persistent loop
    BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr,  # issue the next step's loads before this step's arithmetic (twice the bytes in flight)
    ONE_REDUCTION: tl.constexpr,  # the three sums after the mean in one tl.reduce: two rounds of exchange, not four
    FUSED_SUM: tl.constexpr,  # the last program adds the partial rows (seeds/_common.py finish_partials)
    GROUP: tl.constexpr, MAX_ROWS: tl.constexpr, BLOCK_C: tl.constexpr,  # finish_partials' tiling
):
    # With xh = (x - mean) * rstd and g = dy * w, differentiating through mean and rstd:
    #   dx_i = rstd * (g_i - mean_j(g_j) - xh_i * mean_j(g_j * xh_j))
    #   dw_j = sum over rows of dy_j * xh_j,   db_j = sum over rows of dy_j
    # With xc = x - mean, mean_j(g_j * xh_j) = rstd * mean_j(g_j * xc_j): after the mean (kept first for the exact
    # two-pass variance), ONE_REDUCTION takes sum(xc^2), sum(g) and sum(g * xc) in one reduce.
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    num_steps = tl.cdiv(M, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    if PREFETCH:
        x_next, dy_next = _load_pair(X, DY, pid, M, N, stride_x, stride_dy, ROWS, BLOCK_N)
    for step in range(pid, num_steps, num_programs):
        if PREFETCH:
            x, dy = x_next, dy_next
            x_next, dy_next = _load_pair(X, DY, step + num_programs, M, N, stride_x, stride_dy, ROWS, BLOCK_N)
        else:
            x, dy = _load_pair(X, DY, step, M, N, stride_x, stride_dy, ROWS, BLOCK_N)
        x = x.to(tl.float32)
        dy = dy.to(tl.float32)
        mean = tl.sum(x, axis=1) / N
        xc = tl.where(col_ok[None, :], x - mean[:, None], 0.0)
        g = dy * w[None, :]
        if ONE_REDUCTION:
            sum_xcxc, sum_g, sum_gxc = tl.reduce((xc * xc, g, g * xc), 1, add_triple)
            rstd = tl.rsqrt(sum_xcxc / N + eps)
            xh = xc * rstd[:, None]
            c1 = sum_g / N
            c2 = sum_gxc * rstd / N
        else:
            rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
            xh = xc * rstd[:, None]
            c1 = tl.sum(g, axis=1) / N
            c2 = tl.sum(g * xh, axis=1) / N
        dx = (g - c1[:, None] - xh * c2[:, None]) * rstd[:, None]
        rows = step * ROWS + tl.arange(0, ROWS)
        mask = (rows[:, None] < M) & col_ok[None, :]
        rows = rows.to(tl.int64)[:, None]
        tl.store(DX + rows * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * xh, axis=0)
        db += tl.sum(dy, axis=0)
    offs = pid.to(tl.int64) * N + cols
    tl.store(DW_PARTIAL + offs, dw, mask=col_ok)
    tl.store(DB_PARTIAL + offs, db, mask=col_ok)
    if FUSED_SUM:
        finish_partials(DW_PARTIAL, DW_SCRATCH, DW, DB_PARTIAL, DB_SCRATCH, DB, COUNTERS, pid, num_programs, N,
                        GROUP, True, MAX_ROWS, BLOCK_C)


# ---- launchers ------------------------------------------------------------------------------------------------------

def _check(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> None:
    if not (x.is_floating_point() and w.is_floating_point() and b.is_floating_point()):
        raise TypeError(f"layernorm needs floating tensors, got x {x.dtype}, w {w.dtype}, b {b.dtype}")
    if w.dim() != 1 or b.shape != w.shape or x.shape[-1] != w.shape[0]:
        raise ValueError(f"layernorm weight {tuple(w.shape)} and bias {tuple(b.shape)} do not match the last "
                         f"dimension of x {tuple(x.shape)}")
    if not (x.device == w.device == b.device):
        raise ValueError(f"x, w and b must be on one device, got {x.device}, {w.device}, {b.device}")


def fwd_config(n: int, elem_bytes: int) -> tuple[int, int]:
    """(rows per program, warps) for the forward: one row per program, about 1 KiB of row per warp."""
    return 1, row_warps(row_block(n), elem_bytes)


def bwd_config(n: int, elem_bytes: int) -> tuple[int, int, int]:
    """(programs per SM, rows per step, warps) for the persistent backward. On the H200 at 16384x4096 bf16, two
    programs per SM with one row per step and 8 warps led (2,446 GB/s); two rows per step lost 16%."""
    return 2, 1, row_warps(row_block(n), elem_bytes)


def layernorm_fwd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, *, rows: int | None = None,
                  num_warps: int | None = None) -> torch.Tensor:
    """y = (x - mean) / sqrt(var + eps) * w + b over the last dimension, in x's dtype."""
    _check(x, w, b)
    x2 = as_rows(x)
    m, n = x2.shape
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.numel():
        d_rows, d_warps = fwd_config(n, x.element_size())
        rows = rows or d_rows
        _layernorm_fwd_kernel[(triton.cdiv(m, rows),)](
            x2, w, b, y, m, n, x2.stride(0), y.stride(0), eps,
            ROWS=rows, BLOCK_N=row_block(n), num_warps=num_warps or d_warps,
        )
    return y.view(x.shape)


def layernorm_fwd_rows(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float,
                       variant: RowVariant = RowVariant(), *, one_pass: bool = False,
                       programs: int | None = None, stages: int = 1, wide: bool | None = None) -> torch.Tensor:
    """layernorm_fwd's contract through the 1-D row kernel of this file, launched as `variant` says (warps, memory
    hints, persistent grid, prefetch, register cap; `chunk` must be 0). `one_pass`: mean and variance from one
    reduction of shifted sums, for 16-bit x only (fp32 x keeps the exact two-pass: where the shift is a row's
    outlier, the one-pass variance loses ~1e-4 relative, invisible at 16-bit precision but not at fp32's);
    `programs`, `stages`, `wide`: as in seeds/rmsnorm.py's rmsnorm_fwd_rows. Options for the GPU sweep
    (benchmarks/sweep_fwd_rows.py); layernorm_fwd stays the default: on the H200 one_pass read 3,824
    GB/s against its 3,760 (1.7%, not worth the cancellation where the shift is an outlier), persistent grids
    3,253-3,485."""
    _check(x, w, b)
    if variant.chunk:
        raise ValueError("the LayerNorm row kernel keeps its row in registers: chunk must be 0")
    if programs is not None and programs < 1:
        raise ValueError(f"programs must be a positive grid size, got {programs}")
    _check_stages(stages, variant, programs)
    x2 = as_rows(x)
    m, n = x2.shape
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.numel():
        block = row_block(n)
        _layernorm_fwd_row_kernel[(min(programs, m) if programs else variant.grid(m, x.device),)](
            x2, w, b, y, m, n, x2.stride(0), y.stride(0), eps,
            BLOCK_N=block, EVEN_N=n == block, WIDE=needs_wide_offsets(x2, y) if wide is None else wide,
            LOAD_POLICY=variant.load_policy, STORE_CACHE=variant.store_cache,
            PERSISTENT=bool(variant.programs_per_sm or programs), PREFETCH=variant.prefetch, STAGES=stages,
            ONE_PASS=one_pass and x.element_size() < 4, **variant.launch_options(block, x.element_size()),
        )
    return y.view(x.shape)


def layernorm_bwd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, dy: torch.Tensor, eps: float, *,
                  programs_per_sm: int | None = None, rows: int | None = None, num_warps: int | None = None,
                  prefetch: bool | None = None, one_reduction: bool = False, fused_sum: bool = False,
                  maxnreg: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, db) of y = layernorm(x) * w + b for the upstream gradient dy; dx in x's dtype, dw/db in w's/b's.
    Options (timed by benchmarks/sweep_norm_bwd.py): `prefetch` loads the next rows before the current
    rows' arithmetic (the default on a GPU, with maxnreg PREFETCH_MAXNREG: 16384x4096 bf16, 0.1201 ms =
    3,352 GB/s against 0.1651 without); `one_reduction` takes the three sums after the mean in one reduce;
    `fused_sum` adds the dw and db partials inside the kernel (the last program to finish, in a fixed order)
    instead of a second launch; `maxnreg` caps the registers a thread (ptxas spills past it), to hold a number
    of programs per SM."""
    _check(x, w, b)
    if dy.shape != x.shape or dy.device != x.device:
        raise ValueError(f"dy {tuple(dy.shape)} on {dy.device} does not match x {tuple(x.shape)} on {x.device}")
    x2, dy2 = as_rows(x), as_rows(dy)
    m, n = x2.shape
    dx = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    dw = torch.empty(n, dtype=w.dtype, device=w.device)
    db = torch.empty(n, dtype=b.dtype, device=b.device)
    if m == 0:
        return dx.view(x.shape), dw.zero_(), db.zero_()
    d_per_sm, d_rows, d_warps = bwd_config(n, x.element_size())
    rows = rows or d_rows
    warps = num_warps or d_warps
    if prefetch is None:  # the GPU default (sweep_norm_bwd.py)
        prefetch = x.is_cuda
    if maxnreg is None and prefetch and x.is_cuda:
        maxnreg = PREFETCH_MAXNREG
    grid = min(triton.cdiv(m, rows), sm_count(x.device) * (programs_per_sm or d_per_sm))
    dw_partial = torch.empty((grid, n), dtype=torch.float32, device=x.device)
    db_partial = torch.empty((grid, n), dtype=torch.float32, device=x.device)
    scratch, counters, tiling = fused_sum_args(fused_sum, [dw_partial, db_partial], warps)
    _layernorm_bwd_kernel[(grid,)](
        x2, w, dy2, dx, dw_partial, db_partial, *scratch, dw, db, counters, m, n,
        x2.stride(0), dy2.stride(0), dx.stride(0), eps,
        ROWS=rows, BLOCK_N=row_block(n), PREFETCH=prefetch, ONE_REDUCTION=one_reduction, FUSED_SUM=fused_sum,
        num_warps=warps, **tiling, **({"maxnreg": maxnreg} if maxnreg else {}),
    )
    if not fused_sum:
        sum_partials(dw_partial, dw, db_partial, db)
    return dx.view(x.shape), dw, db


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm with the Triton backward; saves x, w, b (mean and rstd are recomputed in the backward)."""

    @staticmethod
    def forward(ctx, x, w, b, eps):
        ctx.save_for_backward(x, w, b)
        ctx.eps = eps
        return layernorm_fwd(x, w, b, eps)

    @staticmethod
    def backward(ctx, dy):
        x, w, b = ctx.saved_tensors
        dx, dw, db = layernorm_bwd(x, w, b, dy, ctx.eps)
        return dx, dw, db, None


CRUCIBLE_SEED = {"name": "layernorm", "tasks": ["layernorm_fwd.py"], "ops": ["LayerNorm fwd"]}


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.bias = nn.Parameter(torch.zeros(hidden, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return LayerNormFunction.apply(x, self.weight, self.bias, self.eps)
