"""Pieces shared by the row-wise seeds (RMSNorm, LayerNorm, softmax, and any other op that keeps a row in registers).

- `row_block(n)`: the power-of-two block that holds a whole row, with a clear error past the register budget.
- `row_warps(block, elem_bytes)`: warps per program for a one-row-in-registers kernel.
- `sm_count(device)`: streaming multiprocessors, for persistent grids (132 on an H200).
- `as_rows(x)`: a (M, N) view of the last dimension with unit column stride, copying only when it must.
- `_load_pair`: one step's rows of x and dy for the persistent backward kernels (RMSNorm, LayerNorm).
- `_sum_partials_kernel` / `sum_partials(...)`: the deterministic second pass of a weight gradient. A backward
  kernel leaves one fp32 partial row per program (P x N); this kernel adds the P rows in a fixed order, so repeated
  runs agree bitwise (no atomics), and writes the result in the parameter's dtype. Up to two pairs in one launch
  (LayerNorm's dW and dB).
- `finish_partials` (+ `fused_sum_args`): the same sum inside the backward kernel, without the second launch. Each
  program, after storing its partial row, takes a ticket on its group's counter; the last of a group adds the
  group's rows (in program order) into a group row, then takes a ticket on the top counter; the last group adds the
  group rows (in group order) into the result and sets the counters back to zero. Fixed orders, so bitwise
  reproducible; nobody waits for anybody (no spin), so it is safe whatever runs alongside and on the interpreter.
- `add_pair` / `add_triple`: combine functions for `tl.reduce` over a tuple, several row sums in one round of
  shared-memory exchange (one set of barriers) instead of one round each.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

MAX_ROW_BLOCK = 65536  # widest row kept whole in registers (64 fp32 registers per thread at 32 warps)


def row_block(n: int) -> int:
    """The power-of-two block that covers a row of `n` elements."""
    if n > MAX_ROW_BLOCK:
        raise ValueError(f"rows of {n} elements are wider than this kernel keeps in registers ({MAX_ROW_BLOCK}); "
                         "split the last dimension or use a chunked kernel")
    return max(16, triton.next_power_of_2(n))


def row_warps(block: int, elem_bytes: int) -> int:
    """Warps for one row of `block` elements: about 1 KiB of the input row per warp (two 16-byte vectors per
    thread), between 4 and 32. On the H200 (docs/bench-norms.md) this was within 1% of the best variant tried for
    every forward (8 warps at 4096 bf16, 16 at 8192); 32 warps at 8192 lost 20-30%."""
    return max(4, min(32, block * elem_bytes // 1024))


@functools.lru_cache(maxsize=None)
def _sm_count_cuda(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device; a small fixed number elsewhere (the CPU interpreter), so the persistent
    grids and their partial sums are still exercised with several programs."""
    if device.type == "cuda":
        return _sm_count_cuda(device.index if device.index is not None else torch.cuda.current_device())
    return 4


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """(M, N) over the last dimension, unit stride along N; copies only a tensor whose rows cannot be viewed."""
    if x.dim() == 0:
        raise ValueError("expected a tensor with at least one dimension, got a scalar")
    n = x.shape[-1]
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 2:
        return x
    if x.is_contiguous():
        return x.view(-1, n)
    return x.reshape(-1, n)


@triton.jit
def grouped_tile(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """(m-block, n-block) of a GEMM tile: GROUP_M consecutive m-blocks sweep the n-blocks together, so the n-side
    operand's tiles are reused from L2 (the MoE and linear + cross-entropy GEMMs)."""
    group = tile // (GROUP_M * num_n)
    first_m = group * GROUP_M
    group_size = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % (GROUP_M * num_n)) % group_size
    pid_n = (tile % (GROUP_M * num_n)) // group_size
    return pid_m, pid_n


@triton.jit
def _load_pair(X, DY, step, M, N, stride_x, stride_dy, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    # Rows [step * ROWS, step * ROWS + ROWS) of x and dy in their storage dtype; rows past M read as zeros.
    rows = step * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    rows = rows.to(tl.int64)[:, None]
    x = tl.load(X + rows * stride_x + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
    dy = tl.load(DY + rows * stride_dy + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
    return x, dy


@triton.jit
def _sum_partials_kernel(
    P1, O1,  # P1: (num_partials, N) fp32 partial sums; O1: (N,) result in the parameter's dtype
    P2, O2,  # a second pair of the same shape, read only when TWO
    num_partials, N,
    TWO: tl.constexpr,
    BLOCK_P: tl.constexpr,  # partial rows per step
    BLOCK_N: tl.constexpr,  # columns per program
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    acc1 = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for start in range(0, num_partials, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        offs = rows[:, None].to(tl.int64) * N + cols[None, :]
        mask = (rows[:, None] < num_partials) & col_ok[None, :]
        acc1 += tl.load(P1 + offs, mask=mask, other=0.0)
        if TWO:
            acc2 += tl.load(P2 + offs, mask=mask, other=0.0)
    tl.store(O1 + cols, tl.sum(acc1, axis=0).to(O1.dtype.element_ty), mask=col_ok)
    if TWO:
        tl.store(O2 + cols, tl.sum(acc2, axis=0).to(O2.dtype.element_ty), mask=col_ok)


def sum_partials(partial: torch.Tensor, out: torch.Tensor, partial2: torch.Tensor | None = None,
                 out2: torch.Tensor | None = None) -> None:
    """out[j] = sum_p partial[p, j] (and the same for the second pair), in a fixed order."""
    num_partials, n = partial.shape
    # 32 columns (128-byte rows of fp32) per program gives N/32 programs (128 at N=4096); up to 128 partial rows
    # per step keeps 16 KiB of loads in flight per program, so a few hundred partials take two or three steps.
    block_n = 32
    block_p = min(128, max(16, triton.next_power_of_2(num_partials)))
    two = partial2 is not None
    _sum_partials_kernel[(triton.cdiv(n, block_n),)](
        partial, out, partial2 if two else partial, out2 if two else out, num_partials, n,
        TWO=two, BLOCK_P=block_p, BLOCK_N=block_n, num_warps=4,
    )


# ---- the weight-gradient sum inside the backward kernel (no second launch) -------------------------------------

@triton.jit
def add_pair(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def add_triple(a0, b0, c0, a1, b1, c1):
    return a0 + a1, b0 + b1, c0 + c1


@triton.jit
def _sum_rows(P1, O1, P2, O2, count, N, TWO: tl.constexpr, MAX_ROWS: tl.constexpr, BLOCK_C: tl.constexpr):
    # O1[:N] = sum of the fp32 rows P1[0 : count] (count <= MAX_ROWS), in row order (bitwise reproducible); the
    # same for P2 -> O2 when TWO. One SM runs the last of these at the very end, so its bytes in flight set its
    # speed: the row loop is unrolled and each thread adds its own columns (no cross-thread reduction, hence no
    # barrier between the loads), so a chunk's rows of both inputs are all in flight at once (MAX_ROWS x BLOCK_C
    # x 4 bytes each); the column loop is not unrolled, which bounds the registers this needs. The rows were
    # written by other programs of this launch: loaded with .cg (from L2, never a stale L1 line).
    for start in range(0, N, BLOCK_C):
        cols = start + tl.arange(0, BLOCK_C)
        acc1 = tl.zeros([BLOCK_C], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_C], dtype=tl.float32)
        for r in tl.static_range(MAX_ROWS):
            n_valid = tl.where(r < count, N, 0)  # rows past count read as zeros (a scalar mask, as a column bound)
            acc1 += tl.load(P1 + r * N + cols, mask=cols < n_valid, other=0.0, cache_modifier=".cg")
            if TWO:
                acc2 += tl.load(P2 + r * N + cols, mask=cols < n_valid, other=0.0, cache_modifier=".cg")
        tl.store(O1 + cols, acc1.to(O1.dtype.element_ty), mask=cols < N)
        if TWO:
            tl.store(O2 + cols, acc2.to(O2.dtype.element_ty), mask=cols < N)


@triton.jit
def finish_partials(
    P1, S1, O1,  # P1: (num_programs, N) fp32 partial rows, this program's row stored; S1: (groups, N) fp32
                 # scratch; O1: (N,) the result in the parameter's dtype
    P2, S2, O2,  # a second triple of the same shapes, used only when TWO (LayerNorm's db)
    COUNTERS,    # int32, groups + 1 of them, zero on entry; zero again when the last program is done
    pid, num_programs, N,
    GROUP: tl.constexpr,     # programs per group (about sqrt(num_programs): the last program reads ~2 sqrt rows)
    TWO: tl.constexpr,
    MAX_ROWS: tl.constexpr,  # at least GROUP and the number of groups
    BLOCK_C: tl.constexpr,   # columns per chunk of the sums
):
    # A two-level tree over program ids: whichever program of a group arrives last sums the group, whichever group
    # finishes last sums the groups. The barrier puts every thread's partial stores before the release of the
    # ticket (taken by one thread); the acquire on the ticket orders the reads of the other programs' rows.
    num_groups = tl.cdiv(num_programs, GROUP)
    group = pid // GROUP
    first = (group * GROUP).to(tl.int64) * N
    size = tl.minimum(num_programs - group * GROUP, GROUP)
    tl.debug_barrier()
    ticket = tl.atomic_add(COUNTERS + group, 1, sem="acq_rel", scope="gpu")
    if ticket == size - 1:
        mine = group.to(tl.int64) * N
        _sum_rows(P1 + first, S1 + mine, P2 + first, S2 + mine, size, N, TWO, MAX_ROWS, BLOCK_C)
        tl.debug_barrier()
        top = tl.atomic_add(COUNTERS + num_groups, 1, sem="acq_rel", scope="gpu")
        if top == num_groups - 1:
            _sum_rows(S1, O1, S2, O2, num_groups, N, TWO, MAX_ROWS, BLOCK_C)
            # Every program has taken both its tickets by now: the next launch on this stream finds zeros.
            for i in range(0, num_groups + 1):
                tl.store(COUNTERS + i, 0)


_COUNTERS: dict = {}


def _ticket_counters(device: torch.device, count: int) -> torch.Tensor:
    """`count` zeroed int32 counters, one buffer per device and stream, reused by every launch on that stream
    (launches on one stream run in order, and each leaves the counters at zero): no memset launch per call."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < count:
        buf = torch.zeros(max(count, 64), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


# The norm backwards' register cap with `prefetch` (their GPU default): two rows in flight need ~128 registers a
# thread, and two programs of 8 warps an SM need <= 128. Triton 3.6 gave the LayerNorm kernel more without the cap
# (one program an SM: 0.1639 ms against 0.1201 with it, 16384x4096 bf16).
PREFETCH_MAXNREG = 128


def fused_sum_args(enabled: bool, partials: list[torch.Tensor], num_warps: int) -> tuple[list, torch.Tensor, dict]:
    """(fp32 scratch per partial, counters, constexprs) of `finish_partials` for partial buffers of shape (P, N).
    Groups of ceil(sqrt(P)) programs: the last program reads about 2 sqrt(P) rows (33 at P = 264) instead of P,
    in chunks of 2 fp32 columns a thread per row and input (512 columns at 8 warps: 17 rows x 2 KiB = 34 KiB a
    chunk in flight, 68 KiB for LayerNorm's two).
    Not enabled: placeholders that the kernel never touches."""
    num_programs, n = partials[0].shape
    device = partials[0].device
    if not enabled:
        return list(partials), partials[0], {"GROUP": 1, "MAX_ROWS": 1, "BLOCK_C": 1}
    group = math.isqrt(num_programs - 1) + 1 if num_programs > 1 else 1
    groups = triton.cdiv(num_programs, group)
    block_c = max(16, min(triton.next_power_of_2(n), 64 * num_warps))
    scratch = [torch.empty((groups, n), dtype=torch.float32, device=device) for _ in partials]
    return scratch, _ticket_counters(device, groups + 1), {"GROUP": group, "MAX_ROWS": max(group, groups),
                                                           "BLOCK_C": block_c}


# ---- one-row-per-program kernels (the softmax backward, the fused residual RMSNorm) ----------------------------
LOAD_POLICIES = ("", "evict_first")
STORE_CACHES = ("", ".cs")


class RowVariant:
    """How a one-row-per-program kernel is launched (the softmax backward and the fused residual RMSNorm), checked
    when built. A plain class: agent/archive/export.py vendors it into one file, which a user may load with importlib without
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
def load_cols(ptrs, cols, N, EVEN_N: tl.constexpr, POLICY: tl.constexpr):
    # Columns past N read as zeros; no mask at all when every column is in bounds (EVEN_N).
    if EVEN_N:
        v = tl.load(ptrs, eviction_policy=POLICY)
    else:
        v = tl.load(ptrs, mask=cols < N, other=0.0, eviction_policy=POLICY)
    return v


@triton.jit
def store_cols(ptrs, value, cols, N, EVEN_N: tl.constexpr, CACHE: tl.constexpr):
    if EVEN_N:
        tl.store(ptrs, value, cache_modifier=CACHE)
    else:
        tl.store(ptrs, value, mask=cols < N, cache_modifier=CACHE)


@triton.jit
def load_row_pair(A, B, row, stride_a, stride_b, M, N, cols,
                   EVEN_N: tl.constexpr,     # N == BLOCK_N: no column mask
                   CLAMP_ROW: tl.constexpr,  # row may be >= M (a prefetch past the end): read row M - 1 instead
                   POLICY: tl.constexpr):
    # One row of A and of B in their storage dtype. A clamped prefetch re-reads the last row, which every
    # program's final prefetch shares (one extra row from HBM), and needs no row mask.
    row = tl.cast(row, tl.int64)
    if CLAMP_ROW:
        row = tl.minimum(row, M - 1)
    a = load_cols(A + row * stride_a + cols, cols, N, EVEN_N, POLICY)
    b = load_cols(B + row * stride_b + cols, cols, N, EVEN_N, POLICY)
    return a, b


@triton.jit
def store_row(P, row, stride, N, cols, value, EVEN_N: tl.constexpr, CACHE: tl.constexpr):
    store_cols(P + tl.cast(row, tl.int64) * stride + cols, value.to(P.dtype.element_ty), cols, N, EVEN_N, CACHE)
