"""Softmax backward task seed: (x, dy) -> dx through the kernel of seeds/softmax.py, recomputing y from x in registers.

One pass: read x and dy, write dx. Bytes (bf16, 16384x8192): 3·M·N·2 = 805 MB.

Measured on the H200 (2026-11-29, docs/bench-norms.md): 0.2164 ms = 3,721 GB/s at 16384x8192 bf16 (8 warps),
0.87x torch.compile's backward from the saved y (4,295 GB/s), 1.77x eager; not faster than the best baseline.

Variants (issue 5; `RowVariant`, default off, timed by benchmarks/sweep_norms.py, not yet measured on the GPU): a
one-row kernel, from x or from the saved y, a 1-D block at a scalar row offset with no mask at all when N is the
block (the task's 8192). What each option changes, and what compiling for sm_90 here showed (triton 3.6 and ptxas,
no GPU; registers a thread, SASS instructions of the kernel):
- from y at 16 warps: 46 registers / 216 instructions against the seed's 48 / 216, so the 1-D form alone changes
  little; from x at 8 warps the two sums of a row (sum e and sum e·dy) share one reduction and y is never formed,
  dx = e/s · (dy - d/s) with s = sum e, d = sum e·dy: 576 instructions and 6 barriers against 680 and 8;
- memory hints: `evict_first` on the once-read loads, `.cs` (streaming) on the dx store (the forwards' sweep,
  docs/BENCHMARKS.md run E, found evict_first 2.7-4.5% slower and .cs neutral there);
- a persistent grid (k programs per SM walking rows with a stride), optionally loading the next row before this
  row's arithmetic so a program keeps a row of loads in flight (64 registers from y at 16 warps: 2 programs per
  SM; 128 from x at 8 warps: 1). A prefetch past the last row re-reads row M - 1 instead (no out-of-bounds read;
  the interpreter cannot tell the two apart, so only the GPU run exercises it);
- from y only, `chunk`: two passes over the row in chunks, the second re-reading the row from cache, as
  torch.compile's looped reduction does (its backward is the one the seed trails);
- `maxnreg`: a register cap. Liger's backward holds 32 registers at 16 warps (4 programs per SM, twice the rows in
  flight of the seed's 2) because it does its arithmetic in bf16; fp32 arithmetic on 8192 columns does not fit 32
  without spilling (48 bytes a thread), 40 (3 programs per SM) spills 8.
`_load` / `_store` / `_load_row_pair` / `_store_row` / `RowVariant` are shared with seeds/rmsnorm_residual.py.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl

from seeds._common import as_rows, row_block, row_warps, sm_count
from seeds.softmax import softmax_bwd

CRUCIBLE_SEED = {"name": "softmax_bwd", "tasks": ["softmax_bwd.py"], "ops": ["softmax bwd (last dim)"]}

LOAD_POLICIES = ("", "evict_first")
STORE_CACHES = ("", ".cs")


class RowVariant:
    """How a one-row-per-program kernel is launched (the softmax backward and the fused residual RMSNorm), checked
    when built. A plain class: agent/export.py vendors it into one file, which a user may load with importlib without
    registering it in sys.modules, where a dataclass under `from __future__ import annotations` cannot be built; and
    the harness's static check refuses the `super().__new__` a validated NamedTuple would need."""

    def __init__(self, num_warps: int | None = None, load_policy: str = "", store_cache: str = "",
                 programs_per_sm: int = 0, prefetch: bool = False, chunk: int = 0, maxnreg: int | None = None):
        self.num_warps = num_warps              # None: seeds._common.row_warps (about 1 KiB of row per warp)
        self.load_policy = load_policy          # eviction policy of the once-read loads: "" or "evict_first"
        self.store_cache = store_cache          # cache modifier of the output stores: "" or ".cs" (streaming)
        self.programs_per_sm = programs_per_sm  # 0: one program per row; k > 0: a persistent grid, k per SM
        self.prefetch = prefetch                # persistent: issue the next row's loads before this row's arithmetic
        self.chunk = chunk                      # softmax from y: 0 keeps the row in registers; c > 0: two passes
        self.maxnreg = maxnreg                  # register cap a thread (ptxas spills past it): more programs per SM
        if load_policy not in LOAD_POLICIES:
            raise ValueError(f"load_policy must be one of {LOAD_POLICIES}, got {load_policy!r}")
        if store_cache not in STORE_CACHES:
            raise ValueError(f"store_cache must be one of {STORE_CACHES}, got {store_cache!r}")
        if num_warps is not None and num_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"num_warps must be a power of two from 1 to 32, got {num_warps}")
        if programs_per_sm < 0:
            raise ValueError(f"programs_per_sm must be 0 (one program per row) or more, got {programs_per_sm}")
        if prefetch and not programs_per_sm:
            raise ValueError("prefetch needs a persistent grid (programs_per_sm > 0): a one-row program has no "
                             "next row")
        if chunk and (chunk < 16 or chunk & (chunk - 1)):
            raise ValueError(f"chunk must be 0 or a power of two of at least 16, got {chunk}")
        if maxnreg is not None and not 24 <= maxnreg <= 255:
            raise ValueError(f"maxnreg must be between 24 and 255 registers, got {maxnreg}")
        if chunk and (programs_per_sm or prefetch):
            raise ValueError("the two-pass (chunk) kernel runs one program per row: no persistent grid or prefetch")

    def __repr__(self) -> str:
        return (f"RowVariant(num_warps={self.num_warps}, load_policy={self.load_policy!r}, "
                f"store_cache={self.store_cache!r}, programs_per_sm={self.programs_per_sm}, "
                f"prefetch={self.prefetch}, chunk={self.chunk}, maxnreg={self.maxnreg})")

    def grid(self, m: int, device: torch.device) -> int:
        return m if not self.programs_per_sm else max(1, min(m, sm_count(device) * self.programs_per_sm))

    def launch_options(self, block: int, elem_bytes: int) -> dict:
        """num_warps (and maxnreg when set) for a kernel over rows of `block` elements."""
        options = {"num_warps": self.num_warps or row_warps(block, elem_bytes)}
        if self.maxnreg is not None:
            options["maxnreg"] = self.maxnreg
        return options


@triton.jit
def _load(ptrs, cols, N, EVEN_N: tl.constexpr, POLICY: tl.constexpr):
    # Columns past N read as zeros; no mask at all when every column is in bounds (EVEN_N).
    if EVEN_N:
        v = tl.load(ptrs, eviction_policy=POLICY)
    else:
        v = tl.load(ptrs, mask=cols < N, other=0.0, eviction_policy=POLICY)
    return v


@triton.jit
def _store(ptrs, value, cols, N, EVEN_N: tl.constexpr, CACHE: tl.constexpr):
    if EVEN_N:
        tl.store(ptrs, value, cache_modifier=CACHE)
    else:
        tl.store(ptrs, value, mask=cols < N, cache_modifier=CACHE)


@triton.jit
def _load_row_pair(A, B, row, stride_a, stride_b, M, N, cols,
                   EVEN_N: tl.constexpr,     # N == BLOCK_N: no column mask
                   CLAMP_ROW: tl.constexpr,  # row may be >= M (a prefetch past the end): read row M - 1 instead
                   POLICY: tl.constexpr):
    # One row of A and of B in their storage dtype. A clamped prefetch re-reads the last row, which every
    # program's final prefetch shares (one extra row from HBM), and needs no row mask.
    row = tl.cast(row, tl.int64)
    if CLAMP_ROW:
        row = tl.minimum(row, M - 1)
    a = _load(A + row * stride_a + cols, cols, N, EVEN_N, POLICY)
    b = _load(B + row * stride_b + cols, cols, N, EVEN_N, POLICY)
    return a, b


@triton.jit
def _store_row(P, row, stride, N, cols, value, EVEN_N: tl.constexpr, CACHE: tl.constexpr):
    _store(P + tl.cast(row, tl.int64) * stride + cols, value.to(P.dtype.element_ty), cols, N, EVEN_N, CACHE)


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
        s_next, dy_next = _load_row_pair(S, DY, pid, stride_s, stride_dy, M, N, cols, EVEN_N, True, LOAD_POLICY)
    for row in range(pid, M, step):
        if PREFETCH:
            s, dy = s_next, dy_next
            s_next, dy_next = _load_row_pair(S, DY, row + step, stride_s, stride_dy, M, N, cols, EVEN_N, True,
                                             LOAD_POLICY)
        else:
            s, dy = _load_row_pair(S, DY, row, stride_s, stride_dy, M, N, cols, EVEN_N, False, LOAD_POLICY)
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
        _store_row(DX, row, stride_dx, N, cols, dx, EVEN_N, STORE_CACHE)


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
        y = _load(y_row + start + cols, start + cols, N, EVEN_N, "evict_last")
        dy = _load(dy_row + start + cols, start + cols, N, EVEN_N, "evict_last")
        acc += y.to(tl.float32) * dy.to(tl.float32)
    dot = tl.sum(acc, axis=0)
    for start in range(0, N, CHUNK):
        y = _load(y_row + start + cols, start + cols, N, EVEN_N, "evict_first")
        dy = _load(dy_row + start + cols, start + cols, N, EVEN_N, "evict_first")
        dx = y.to(tl.float32) * (dy.to(tl.float32) - dot)
        _store(dx_row + start + cols, dx.to(DX.dtype.element_ty), start + cols, N, EVEN_N, STORE_CACHE)


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
