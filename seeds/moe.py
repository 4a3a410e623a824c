"""Mixture-of-Experts dispatch and grouped GEMM over experts with uneven loads, forward and backward.

The layout every MoE kernel here shares is vLLM's `moe_align_block_size`: the T*K (token, slot) pairs of a top-K
routing, identified by their flat index i = t*K + k, sorted by expert (stably: by i within an expert), each
expert's run padded to a multiple of BLOCK_M with a sentinel id (T*K), so that every BLOCK_M-row block of the
sorted list belongs to one expert:
    sorted_ids   [T*K + E*(BLOCK_M-1)] int32  flat ids in expert order, sentinel-padded
    expert_ids   [len(sorted_ids) / BLOCK_M] int32  the expert of each block (-1 past the end)
    num_padded   [1] int32                    padded rows in use (a multiple of BLOCK_M), read on the device
    expert_start / expert_count [E] int32     each expert's first padded row and its number of real rows
Three kernels build it without atomics (so it is deterministic): per-chunk histograms, one scan program, a
scatter that ranks each pair inside its chunk with a cumulative sum over a one-hot [chunk, E] matrix.
`by_position` views a layout with each routed row named by its sorted position instead of its id, for operands kept
in sorted order (the MoE block's backward, seeds/moe_block.py).

Grouped GEMM (forward, persistent): C[row(i)] = A[row(i)] @ B[e]^T for every sorted id i of expert e. Programs
walk the (m-block, n-block) tiles of the padded layout; the number of tiles is read on the device, so no host
sync is needed. A rows may be gathered (A row = id // K: the K copies of a token share its hidden state) and C
rows scattered back to id order. With SWIGLU the program keeps two accumulators (gate and up rows of B, F rows
apart) and stores silu(gate) * up, so the [T*K, 2F] product never exists.
Backward: dA = dC @ B[e] is the same kernel with B's strides swapped; dB[e] = dC_e^T @ A_e (here dW per expert of
a [E, F, H] weight; X_e^T dY_e for the transposed layout) is `_grouped_dw_kernel`, one program per
(expert, n-block, k-block) tile reducing over that expert's rows, no split-K, so it is deterministic.
FLOPs: 2 R N K forward for R routed rows, twice that backward. At 64 experts x 2048 rows, H 4096 -> F 1408:
1.51 TFLOP forward; 2.3 ms at the 640 TFLOP/s target (ANCHORS.md: per-expert loop 592, torch._grouped_mm 573).

Two kernels compute it (grouped_gemm's `impl`): `_grouped_gemm_kernel` ("ptr") loads every tile through pointers;
`_grouped_gemm_tma_kernel` ("tma", the default where its rules hold) fetches B's tiles by TMA from B viewed 2D
([E*N, K], or [E*K, N] transposed) through a host TensorDescriptor, and A's too where a block's BM rows are one run
of A (sorted positions, or a contiguous layout from align_counts); a top-K gather keeps pointer loads for A, since
Hopper's TMA cannot gather rows. Its persistent tile loop can be warp-specialised or flattened, full blocks of C
stored by TMA (tma_store), and the tile computed as two half-width accumulators (split_n: the epilogue converts half
a tile at a time, so at 256x128x64 a 4th stage fits in 227 KiB); launcher options, swept by benchmarks/sweep_moe.py.
Rows and columns a TMA box reads past an expert's end are computed and never stored. Where B's 2D view breaks the
descriptor rules (row bytes not a multiple of 16, a transposed B whose K is not a multiple of BK) the pointer
kernel runs. dW has the same pair (`_grouped_dw_tma_kernel`: full row steps by TMA on a contiguous layout).

Measured on the H200 (benchmarks/bench_moe.py, do_bench): grouped GEMM, 64 experts x
2048 tokens, H4096 -> F1408: the TMA kernel with 256-row blocks and a flattened tile loop 2.329 ms = 649 TFLOP/s,
1.07x torch._grouped_mm (609) and 1.05x a loop of matmuls (617), 0.97x a uniform bmm (671); with one expert at 8x
the average load 587 TFLOP/s (-9.6%; grouped_mm 559, loop 587). The pointer kernel: 499 / 482. Swept
(benchmarks/sweep_moe.py, do_bench, same run): the default 666.3 TFLOP/s, 1.08x torch._grouped_mm (615.2), 586.6 at
8x skew (grouped_mm 562.3, loop 603.2); the same tiles at 4 stages, loop not flattened, 727.9 (1.18x) / 573.7, but
under `crucible bench`'s sustained timer (one after the other on one GPU) 625.7 TFLOP/s against the
default's 648.4 (1.09x the loop), so the default stays; split_n and tma_store lost (439-525 TFLOP/s; tma_store with
split_n does not compile in triton 3.6). Backward: dX 600 TFLOP/s (0.97x grouped_mm), dW 608 (1.01x).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from seeds._common import grouped_tile, sm_count
from seeds.cross_entropy import needs_rne, round_bf16_rne

CRUCIBLE_SEED = {
    "name": "moe_grouped_gemm",
    "tasks": ["moe_grouped_gemm.py"],
    "ops": ["MoE align (counts, padded offsets, sorted ids, expert per block)",
            "grouped GEMM over experts, persistent (fwd; dX via the same kernel)"],
}


# ---------------------------------------------------------------------------------------------------------------
# Dispatch: the aligned layout
# ---------------------------------------------------------------------------------------------------------------
@triton.jit
def _align_count_kernel(IDS, n_ids, CHUNK_COUNTS, E, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr):
    """CHUNK_COUNTS[c, e] = number of entries of chunk c (BLOCK_N ids) routed to expert e."""
    c = tl.program_id(0)
    offs = c * BLOCK_N + tl.arange(0, BLOCK_N)
    ids = tl.load(IDS + offs, mask=offs < n_ids, other=-1).to(tl.int32)
    cols = tl.arange(0, BLOCK_E)
    hits = (ids[:, None] == cols[None, :]).to(tl.int32)
    tl.store(CHUNK_COUNTS + c * E + cols, tl.sum(hits, axis=0), mask=cols < E)


@triton.jit
def _align_scan_kernel(
    CHUNK_COUNTS, num_chunks, E,  # [num_chunks, E] counts (any integer dtype)
    CHUNK_OFFSETS,                # out [num_chunks, E] int32: entries of expert e in chunks before c
    EXPERT_START, EXPERT_COUNT, EXPERT_OFFSET,  # out [E] int32: padded start, real rows, unpadded start
    EXPERT_IDS, max_blocks,       # out [max_blocks] int32: the expert of each BLOCK_M block, -1 past the end
    NUM_PADDED,                   # out [1] int32
    BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_B: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_E)
    col_ok = cols < E
    running = tl.zeros([BLOCK_E], dtype=tl.int32)
    for c in range(0, num_chunks):
        tl.store(CHUNK_OFFSETS + c * E + cols, running, mask=col_ok)
        running += tl.load(CHUNK_COUNTS + c * E + cols, mask=col_ok, other=0).to(tl.int32)
    padded = (running + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, axis=0)
    start = end - padded
    tl.store(EXPERT_START + cols, start, mask=col_ok)
    tl.store(EXPERT_COUNT + cols, running, mask=col_ok)
    tl.store(EXPERT_OFFSET + cols, tl.cumsum(running, axis=0) - running, mask=col_ok)
    total = tl.sum(padded, axis=0)
    tl.store(NUM_PADDED, total)
    # Block b (rows b*BLOCK_M...) belongs to the first expert whose padded run ends after its first row; empty
    # experts end where they start and are skipped by the count.
    end = tl.where(col_ok, end, total + BLOCK_M)
    for b0 in range(0, max_blocks, BLOCK_B):
        blocks = b0 + tl.arange(0, BLOCK_B)
        row = blocks * BLOCK_M
        expert = tl.sum((end[None, :] <= row[:, None]).to(tl.int32), axis=1)
        tl.store(EXPERT_IDS + blocks, tl.where(row < total, expert, -1), mask=blocks < max_blocks)


@triton.jit
def _align_scatter_kernel(IDS, n_ids, CHUNK_OFFSETS, EXPERT_START, SORTED_IDS, E,
                          BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr):
    """SORTED_IDS[start[e] + offset[c, e] + rank] = i: a stable counting sort of the flat ids by expert."""
    c = tl.program_id(0)
    offs = c * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = offs < n_ids
    ids = tl.load(IDS + offs, mask=ok, other=-1).to(tl.int32)
    cols = tl.arange(0, BLOCK_E)
    col_ok = cols < E
    hits = (ids[:, None] == cols[None, :]).to(tl.int32)
    rank = tl.sum((tl.cumsum(hits, axis=0) - hits) * hits, axis=1)  # earlier entries of the same expert
    base = tl.load(EXPERT_START + cols, mask=col_ok, other=0) + tl.load(CHUNK_OFFSETS + c * E + cols, mask=col_ok,
                                                                         other=0)
    pos = tl.sum(hits * base[None, :], axis=1) + rank
    tl.store(SORTED_IDS + pos, offs.to(tl.int32), mask=ok)


@triton.jit
def _align_contiguous_kernel(EXPERT_START, EXPERT_COUNT, EXPERT_OFFSET, SORTED_IDS, BLOCK: tl.constexpr):
    """For rows already grouped by expert (counts given): expert e's padded run lists rows offset[e]..+count[e]."""
    e = tl.program_id(0)
    start = tl.load(EXPERT_START + e)
    count = tl.load(EXPERT_COUNT + e)
    first = tl.load(EXPERT_OFFSET + e)
    for j in range(0, count, BLOCK):
        offs = j + tl.arange(0, BLOCK)
        tl.store(SORTED_IDS + start + offs, first + offs, mask=offs < count)


@triton.jit
def _positions_kernel(SORTED_IDS, POSITIONS, n_valid, n, BLOCK: tl.constexpr):
    """POSITIONS[p] = p where sorted position p holds a routed id, else n (the sentinel of a positional layout)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ids = tl.load(SORTED_IDS + offs, mask=offs < n, other=n_valid)
    tl.store(POSITIONS + offs, tl.where(ids < n_valid, offs, n), mask=offs < n)


class Aligned:
    """The aligned layout of one routing (see the module docstring); `n_valid` is the sentinel id."""

    def __init__(self, sorted_ids, expert_ids, num_padded, expert_start, expert_count, expert_offset, n_valid,
                 block_m, contiguous):
        self.sorted_ids, self.expert_ids, self.num_padded = sorted_ids, expert_ids, num_padded
        self.expert_start, self.expert_count, self.expert_offset = expert_start, expert_count, expert_offset
        self.n_valid, self.block_m = n_valid, block_m
        self.contiguous = contiguous  # the ids of each expert are one run (offset[e] ...): rows a TMA box can read


def _alloc_layout(n_ids: int, experts: int, block_m: int, device) -> tuple:
    max_rows = triton.cdiv(n_ids + experts * (block_m - 1), block_m) * block_m
    sorted_ids = torch.full((max(max_rows, block_m),), n_ids, dtype=torch.int32, device=device)
    max_blocks = sorted_ids.numel() // block_m
    expert_ids = torch.empty(max_blocks, dtype=torch.int32, device=device)
    vecs = torch.empty((3, experts), dtype=torch.int32, device=device)  # start, count, unpadded offset
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    return sorted_ids, expert_ids, vecs, num_padded


def _scan(chunk_counts, experts, block_m, expert_ids, vecs, num_padded) -> torch.Tensor:
    chunk_offsets = torch.empty_like(chunk_counts, dtype=torch.int32)
    _align_scan_kernel[(1,)](chunk_counts, chunk_counts.shape[0], experts, chunk_offsets, vecs[0], vecs[1], vecs[2],
                             expert_ids, expert_ids.numel(), num_padded, BLOCK_M=block_m,
                             BLOCK_E=_block_e(experts), BLOCK_B=64, num_warps=4)
    return chunk_offsets


def _block_e(experts: int) -> int:
    return max(16, triton.next_power_of_2(experts))


def align_block_size(topk_ids: torch.Tensor, experts: int, block_m: int) -> Aligned:
    """The aligned layout of a routing `topk_ids` [T, K] (any integer dtype, values in [0, experts))."""
    if experts > 1024:
        raise ValueError(f"align_block_size: at most 1024 experts are kept in one program, got {experts}")
    ids = topk_ids.reshape(-1)
    n = ids.numel()
    sorted_ids, expert_ids, vecs, num_padded = _alloc_layout(n, experts, block_m, ids.device)
    block_e = _block_e(experts)
    chunk = max(16, min(1024, 16384 // block_e))  # a [chunk, E] one-hot of at most 16k int32 per program
    num_chunks = max(1, triton.cdiv(n, chunk))
    chunk_counts = torch.empty((num_chunks, experts), dtype=torch.int32, device=ids.device)
    _align_count_kernel[(num_chunks,)](ids, n, chunk_counts, experts, BLOCK_N=chunk, BLOCK_E=block_e, num_warps=4)
    chunk_offsets = _scan(chunk_counts, experts, block_m, expert_ids, vecs, num_padded)
    _align_scatter_kernel[(num_chunks,)](ids, n, chunk_offsets, vecs[0], sorted_ids, experts, BLOCK_N=chunk,
                                         BLOCK_E=block_e, num_warps=4)
    return Aligned(sorted_ids, expert_ids, num_padded, vecs[0], vecs[1], vecs[2], n, block_m, contiguous=False)


def align_counts(counts: torch.Tensor, n_rows: int, block_m: int) -> Aligned:
    """The aligned layout of rows already grouped by expert: expert e owns the next counts[e] rows."""
    experts = counts.numel()
    sorted_ids, expert_ids, vecs, num_padded = _alloc_layout(n_rows, experts, block_m, counts.device)
    _scan(counts.reshape(1, experts), experts, block_m, expert_ids, vecs, num_padded)
    _align_contiguous_kernel[(experts,)](vecs[0], vecs[1], vecs[2], sorted_ids, BLOCK=256, num_warps=4)
    return Aligned(sorted_ids, expert_ids, num_padded, vecs[0], vecs[1], vecs[2], n_rows, block_m, contiguous=True)


def by_position(layout: Aligned) -> Aligned:
    """The layout with each routed row named by its sorted position instead of its id: for operands kept in sorted
    order ([len(sorted_ids), N], padding rows included), as the MoE block's backward keeps them. Expert e's rows are
    then the one run start[e] .. start[e] + count[e], so grouped_dw reads them by TMA where it can."""
    n = layout.sorted_ids.numel()
    positions = torch.empty_like(layout.sorted_ids)
    _positions_kernel[(triton.cdiv(n, 1024),)](layout.sorted_ids, positions, layout.n_valid, n, BLOCK=1024,
                                                num_warps=4)
    return Aligned(positions, layout.expert_ids, layout.num_padded, layout.expert_start, layout.expert_count,
                   layout.expert_start, n, layout.block_m, contiguous=True)


# ---------------------------------------------------------------------------------------------------------------
# Grouped GEMM
# ---------------------------------------------------------------------------------------------------------------
@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    if UPCAST:  # the CPU interpreter: its bf16 tl.dot is wrong in Triton 3.9; bf16 products are exact in fp32
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif IEEE:  # fp32 inputs: full fp32 products (tf32 would fail an fp32 tolerance)
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _round_to(x, dtype: tl.constexpr, RNE: tl.constexpr):
    """fp32 x rounded to `dtype` and back (round to nearest even on the interpreter too)."""
    if RNE:
        return round_bf16_rne(x)
    return x.to(dtype).to(tl.float32)


@triton.jit
def _grouped_gemm_kernel(
    A, B, C,
    SORTED_IDS, EXPERT_IDS, NUM_PADDED,  # the aligned layout
    n_valid,                  # sorted ids >= n_valid are padding
    N, K,
    stride_am, stride_ak,
    stride_be, stride_bn, stride_bk,  # B[e, n, k]: any layout ([E, N, K] weights, or their transpose)
    stride_cm, stride_cn,
    up_offset,                # with SWIGLU: elements between a gate row of B and its up row (F * stride_bn)
    A_ROW_DIV: tl.constexpr,  # A's row of a sorted id (K with top-K routing: the copies share their token's row)
    GATHER_A: tl.constexpr,   # A rows by id (else by sorted position)
    SCATTER_C: tl.constexpr,  # C rows by id (else by sorted position)
    SWIGLU: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, RNE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
):
    num_m = tl.load(NUM_PADDED) // BM
    num_n = tl.cdiv(N, BN)
    num_tiles = num_m * num_n
    for tile in range(tl.program_id(0), num_tiles, NUM_PROGRAMS):
        pid_m, pid_n = grouped_tile(tile, num_m, num_n, GROUP_M)

        expert = tl.load(EXPERT_IDS + pid_m).to(tl.int64)
        pos = pid_m * BM + tl.arange(0, BM)
        ids = tl.load(SORTED_IDS + pos)
        row_ok = ids < n_valid
        if GATHER_A:
            a_rows = (ids // A_ROW_DIV).to(tl.int64)
        else:
            a_rows = pos.to(tl.int64)
        rn = pid_n * BN + tl.arange(0, BN)
        n_ok = rn < N
        rk = tl.arange(0, BK)
        a_ptrs = A + a_rows[:, None] * stride_am + rk[None, :] * stride_ak
        b_ptrs = B + expert * stride_be + rn[None, :].to(tl.int64) * stride_bn + rk[:, None] * stride_bk
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        acc_up = tl.zeros([BM, BN], dtype=tl.float32)
        for k in range(0, K, BK):
            k_ok = (k + rk) < K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc = _dot(a, b, acc, UPCAST, IEEE)
            if SWIGLU:
                b_up = tl.load(b_ptrs + up_offset, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                acc_up = _dot(a, b_up, acc_up, UPCAST, IEEE)
            a_ptrs += BK * stride_ak
            b_ptrs += BK * stride_bk
        if SWIGLU:
            # silu(gate) * up with the rounding points of the bf16 reference (gate, up, silu(gate) each rounded to
            # the output dtype): the rounding errors then track PyTorch's own, elementwise, where one rounding of
            # the fp32 product would differ from it on outlier inputs. A few casts in the epilogue.
            gate = _round_to(acc, C.dtype.element_ty, RNE)
            act = _round_to(gate * tl.sigmoid(gate), C.dtype.element_ty, RNE)
            acc = act * _round_to(acc_up, C.dtype.element_ty, RNE)
        if RNE:
            acc = round_bf16_rne(acc)
        if SCATTER_C:
            c_rows = ids.to(tl.int64)
        else:
            c_rows = pos.to(tl.int64)
        c_ptrs = C + c_rows[:, None] * stride_cm + rn[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def _grouped_gemm_tma_kernel(
    A,                        # A_TMA: a descriptor over A [rows, K] (block [BM, BK]); else A's pointer
    B_DESC,                   # a descriptor over B viewed 2D: [E*N', K] (block [BN / SPLIT_N, BK]) or, B_KN, [E*K, N]
    C,                        # ([BK, BN / SPLIT_N])
    C_DESC,                   # C_TMA: a descriptor over C [rows, N] (block [BM, BN // SPLIT_N]); else None
    SORTED_IDS, EXPERT_IDS, NUM_PADDED, n_valid, N, K,
    stride_am, stride_ak,     # A's strides (pointer loads only)
    stride_cm, stride_cn,
    b_rows,                   # rows of B's 2D view per expert: N' (N, or 2N with SWIGLU) or, B_KN, K
    A_ROW_DIV: tl.constexpr, GATHER_A: tl.constexpr, SCATTER_C: tl.constexpr, SWIGLU: tl.constexpr,
    A_TMA: tl.constexpr,      # A by descriptor: the BM rows of a block are consecutive rows of A, from the block's
                              # first sorted position (not GATHER_A) or its first id (GATHER_A: a contiguous layout)
    B_KN: tl.constexpr,       # B's 2D view is [E*K, N] (the transposed layout; K a multiple of BK)
    UPCAST: tl.constexpr, IEEE: tl.constexpr, RNE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, FLATTEN: tl.constexpr,
    C_INT32: tl.constexpr,    # C's element offsets fit in int32: half the registers for the epilogue's addresses
    C_TMA: tl.constexpr,      # full blocks (every row routed) stored by TMA, partial ones by pointers: a block's C
                              # rows are one run (by position, or ids of a contiguous layout)
    SPLIT_N: tl.constexpr,    # 1 or 2 (not with SWIGLU): the C tile as two [BM, BN/2] accumulators, stored one after
                              # the other, so the epilogue's layout conversion needs half the shared memory
):
    # The same product as _grouped_gemm_kernel, with the tiles of B (and of A where its block is one run of rows)
    # fetched by the TMA engine straight into shared memory. A block that ends before BM rows reads the next
    # expert's rows (or TMA's zero fill past the tensor): those rows of C are never stored. A B tile past N reads
    # the next expert's (or the up half's) rows: those columns are never stored either.
    num_m = tl.load(NUM_PADDED) // BM
    num_n = tl.cdiv(N, BN)
    num_tiles = num_m * num_n
    rk = tl.arange(0, BK)
    tile_c = tl.program_id(0) - NUM_PROGRAMS  # the epilogue's own tile counter (as Triton's persistent tutorial)
    BW: tl.constexpr = BN // SPLIT_N  # columns per accumulator
    second = N if SWIGLU else BW      # B rows between the first accumulator's tile and the second's (up, or right)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = grouped_tile(tile, num_m, num_n, GROUP_M)
        expert = tl.load(EXPERT_IDS + pid_m)
        b_row = expert * b_rows
        if A_TMA:
            if GATHER_A:
                a_row = tl.load(SORTED_IDS + pid_m * BM)
            else:
                a_row = pid_m * BM
        else:
            ids_a = tl.load(SORTED_IDS + pid_m * BM + tl.arange(0, BM))
            a_ok = ids_a < n_valid
            if GATHER_A:
                a_rows = (ids_a // A_ROW_DIV).to(tl.int64)
            else:
                a_rows = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
            a_ptrs = A + a_rows[:, None] * stride_am + rk[None, :] * stride_ak
        acc = tl.zeros([BM, BW], dtype=tl.float32)
        acc2 = tl.zeros([BM, BW], dtype=tl.float32)  # SWIGLU: the up rows' product; SPLIT_N 2: the right half
        for k in range(0, K, BK):
            if A_TMA:
                a = A.load([a_row, k])
            else:
                a = tl.load(a_ptrs, mask=a_ok[:, None] & ((k + rk) < K)[None, :], other=0.0)
                a_ptrs += BK * stride_ak
            if B_KN:
                acc = _dot(a, B_DESC.load([b_row + k, pid_n * BN]), acc, UPCAST, IEEE)
                if SPLIT_N == 2:
                    acc2 = _dot(a, B_DESC.load([b_row + k, pid_n * BN + BW]), acc2, UPCAST, IEEE)
            else:
                acc = _dot(a, B_DESC.load([b_row + pid_n * BN, k]).T, acc, UPCAST, IEEE)
                if SWIGLU or SPLIT_N == 2:
                    acc2 = _dot(a, B_DESC.load([b_row + second + pid_n * BN, k]).T, acc2, UPCAST, IEEE)
        tile_c += NUM_PROGRAMS
        pid_m, pid_n = grouped_tile(tile_c, num_m, num_n, GROUP_M)
        if SWIGLU:  # the rounding points of the bf16 reference, as in _grouped_gemm_kernel
            gate = _round_to(acc, C.dtype.element_ty, RNE)
            act = _round_to(gate * tl.sigmoid(gate), C.dtype.element_ty, RNE)
            acc = act * _round_to(acc2, C.dtype.element_ty, RNE)
        if RNE:
            acc = round_bf16_rne(acc)
            acc2 = round_bf16_rne(acc2)
        pos = pid_m * BM + tl.arange(0, BM)
        ids = tl.load(SORTED_IDS + pos)
        c_rows = ids if SCATTER_C else pos
        if not C_INT32:
            c_rows = c_rows.to(tl.int64)
        # Padding only ever ends an expert's run, so a block whose last sorted id is routed is full.
        full = tl.load(SORTED_IDS + pid_m * BM + BM - 1) < n_valid
        c_row = tl.load(SORTED_IDS + pid_m * BM) if SCATTER_C else pid_m * BM  # the first C row, where full
        row_ok = ids < n_valid
        _store_c(C, C_DESC, acc.to(C.dtype.element_ty), c_rows, row_ok, c_row, pid_n * BN, full, N, stride_cm,
                 stride_cn, C_TMA)
        if SPLIT_N == 2:
            _store_c(C, C_DESC, acc2.to(C.dtype.element_ty), c_rows, row_ok, c_row, pid_n * BN + BW, full, N,
                     stride_cm, stride_cn, C_TMA)


@triton.jit
def _store_c(C, C_DESC, part, c_rows, row_ok, c_row, col, full, N, stride_cm, stride_cn, C_TMA: tl.constexpr):
    """C[c_rows, col:col + width] = part: by TMA where C_TMA and the block is full (its rows are c_row ...), else
    by masked pointer stores (a TMA box would overwrite the next expert's first rows)."""
    rn = col + tl.arange(0, part.shape[1])
    if C_TMA and full:
        C_DESC.store([c_row, col], part)  # columns past N are clipped at the descriptor's bound
    else:
        tl.store(C + c_rows[:, None] * stride_cm + rn[None, :] * stride_cn, part,
                 mask=row_ok[:, None] & (rn < N)[None, :])


@triton.jit
def _dw_tile(tile, num_n, num_k):
    """(expert, column block, K block) of a dW tile: the tiles run expert by expert, K fastest."""
    return tile // (num_n * num_k), (tile % (num_n * num_k)) // num_k, tile % num_k


@triton.jit
def _dw_step(DC, A, rows, ok, rn, rk, n_ok, k_ok, stride_dcm, stride_dcn, stride_am, stride_ak, acc,
             UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """acc += DC[rows, rn]^T @ A[rows, rk] for one step of rows by pointers (rows not `ok` load as zeros)."""
    dc = tl.load(DC + rows[:, None] * stride_dcm + rn[None, :] * stride_dcn, mask=ok[:, None] & n_ok[None, :],
                 other=0.0)
    a = tl.load(A + rows[:, None] * stride_am + rk[None, :] * stride_ak, mask=ok[:, None] & k_ok[None, :], other=0.0)
    return _dot(tl.trans(dc), a, acc, UPCAST, IEEE)


@triton.jit
def _grouped_dw_kernel(
    DC, A, DB,                # DB[e] = DC_e^T @ A_e: DC [rows, N], A [rows, K], DB [E, N, K]
    SORTED_IDS, EXPERT_START, EXPERT_COUNT, n_valid, E, N, K,
    stride_dcm, stride_dcn, stride_am, stride_ak, stride_de, stride_dn, stride_dk,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, RNE: tl.constexpr,
    BN: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr,  # BR rows per step; divides the layout's BLOCK_M
    NUM_PROGRAMS: tl.constexpr,
):
    # dL/dW[e, n, k] = sum over rows r of expert e of dY[r, n] * X[r, k]: a [N, rows] @ [rows, K] product whose
    # reduction runs over the expert's (padded) rows; padding rows load as zeros. An expert without rows gets 0.
    num_n = tl.cdiv(N, BN)
    num_k = tl.cdiv(K, BK)
    for tile in range(tl.program_id(0), E * num_n * num_k, NUM_PROGRAMS):
        e, pid_n, pid_k = _dw_tile(tile, num_n, num_k)
        start = tl.load(EXPERT_START + e)
        count = tl.load(EXPERT_COUNT + e)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = pid_k * BK + tl.arange(0, BK)
        n_ok = rn < N
        k_ok = rk < K
        acc = tl.zeros([BN, BK], dtype=tl.float32)
        for r in range(start, start + count, BR):
            ids = tl.load(SORTED_IDS + r + tl.arange(0, BR))
            acc = _dw_step(DC, A, ids.to(tl.int64), ids < n_valid, rn, rk, n_ok, k_ok, stride_dcm, stride_dcn,
                           stride_am, stride_ak, acc, UPCAST, IEEE)
        if RNE:
            acc = round_bf16_rne(acc)
        d_ptrs = DB + e.to(tl.int64) * stride_de + rn[:, None] * stride_dn + rk[None, :] * stride_dk
        tl.store(d_ptrs, acc.to(DB.dtype.element_ty), mask=n_ok[:, None] & k_ok[None, :])


@triton.jit
def _grouped_dw_tma_kernel(
    DC_DESC, A_DESC,          # descriptors over DC [rows, N] (block [BR, BN]) and A [rows, K] (block [BR, BK])
    DC, A, DB,                # the same tensors by pointer (the last, partial step of each expert), DB [E, N, K]
    EXPERT_OFFSET, EXPERT_COUNT, E, N, K,  # a contiguous layout: expert e owns rows offset[e] .. + count[e]
    stride_dcm, stride_dcn, stride_am, stride_ak, stride_de, stride_dn, stride_dk,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, RNE: tl.constexpr,
    BN: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
):
    # dW[e] = dY_e^T X_e as _grouped_dw_kernel, the expert's full BR-row steps read by TMA (its rows are one run),
    # its last partial step by masked pointer loads (a TMA box would read the next expert's rows).
    num_n = tl.cdiv(N, BN)
    num_k = tl.cdiv(K, BK)
    rr = tl.arange(0, BR)
    for tile in range(tl.program_id(0), E * num_n * num_k, NUM_PROGRAMS):
        e, pid_n, pid_k = _dw_tile(tile, num_n, num_k)
        first = tl.load(EXPERT_OFFSET + e)
        count = tl.load(EXPERT_COUNT + e)
        full = count // BR * BR
        acc = tl.zeros([BN, BK], dtype=tl.float32)
        for r in range(first, first + full, BR):
            dc = DC_DESC.load([r, pid_n * BN])
            a = A_DESC.load([r, pid_k * BK])
            acc = _dot(dc.T, a, acc, UPCAST, IEEE)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = pid_k * BK + tl.arange(0, BK)
        n_ok = rn < N
        k_ok = rk < K
        if full < count:
            acc = _dw_step(DC, A, (first + full + rr).to(tl.int64), (full + rr) < count, rn, rk, n_ok, k_ok,
                           stride_dcm, stride_dcn, stride_am, stride_ak, acc, UPCAST, IEEE)
        if RNE:
            acc = round_bf16_rne(acc)
        d_ptrs = DB + e.to(tl.int64) * stride_de + rn[:, None] * stride_dn + rk[None, :] * stride_dk
        tl.store(d_ptrs, acc.to(DB.dtype.element_ty), mask=n_ok[:, None] & k_ok[None, :])


def default_config(device: torch.device, swiglu: bool = False) -> tuple[int, int, int, int, int, int]:
    """(BM, BN, BK, warps, stages, GROUP_M): on a GPU the best of the H200 sweep of the pointer kernel
    (the grouped GEMM at 128x256x64/3 stages 513 TFLOP/s against 473 at 128x128x64/4;
    the DeepSeek-like layer 4.69 ms with these two against 5.56), small tiles on the interpreter. The SwiGLU variant
    keeps two accumulators, so its n-tile is half as wide. The TMA kernel runs the same tiles until measured."""
    if device.type != "cuda":  # the interpreter pays per operation, not per FLOP: few, wide tiles
        return (16, 128, 128, 4, 1, 4)
    return (128, 128, 64, 8, 3, 8) if swiglu else (128, 256, 64, 8, 3, 8)


LINEAR_CONFIG = (256, 128, 64, 8, 3, 8)  # grouped_linear_fwd's tiles on a GPU, for TMA
IMPLS = ("auto", "tma", "ptr")  # auto: TMA wherever the descriptors' rules hold, else the pointer kernel


def _tma_ok(t: torch.Tensor) -> bool:
    """A 2D tensor one TMA descriptor can cover: unit last stride, 16-byte aligned base and row stride."""
    return (t.dim() == 2 and t.numel() > 0 and t.stride(1) == 1 and t.data_ptr() % 16 == 0
            and t.stride(0) * t.element_size() % 16 == 0)


def _check_impl(impl: str, warp_specialize: bool, flatten: bool, tma_store: bool = False, split_n: int = 1) -> None:
    if impl not in IMPLS:
        raise ValueError(f"grouped GEMM: impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if split_n not in (1, 2):
        raise ValueError(f"grouped GEMM: split_n must be 1 or 2, got {split_n!r}")
    if impl == "ptr" and (warp_specialize or flatten or tma_store or split_n != 1):
        raise ValueError("grouped GEMM: warp specialisation, loop flattening, TMA stores and split_n are options of "
                         "the TMA kernel")


def grouped_gemm(a: torch.Tensor, b: torch.Tensor, layout: Aligned, out: torch.Tensor, *, transpose_b: bool = False,
                 a_row_div: int = 1, gather_a: bool = True, scatter_c: bool = True, swiglu: bool = False,
                 config=None, programs: int | None = None, impl: str = "auto", warp_specialize: bool = False,
                 flatten: bool = False, tma_store: bool = False, split_n: int = 1) -> torch.Tensor:
    """out[row] = a[row] @ b[e]^T (b [E, N, K]) or a[row] @ b[e] (transpose_b: b [E, K, N]) for each routed row
    of the aligned layout; with swiglu, b holds [gate; up] rows (b [E, 2N, K]) and out gets silu(gate) * up.
    impl "tma" (or "auto"): B's tiles by TMA from B viewed 2D, A's too where each block's rows are one run (not a
    top-K gather), persistent tile loop optionally warp-specialised / flattened; it falls back to the pointer
    kernel ("ptr") where B's view breaks the descriptor rules (odd row bytes, a transposed B whose K is not a
    multiple of BK: its boxes would cross into the next expert's rows).
    TMA kernel options (sweep: benchmarks/sweep_moe.py): tma_store, full blocks of C stored by TMA where a block's
    C rows are one run (C by sorted position, or a contiguous layout), partial blocks by pointers; split_n 2 (not
    with swiglu), the tile computed as two [BM, BN/2] accumulators stored one after the other, so the epilogue's
    layout conversion takes half the shared memory (at 256x128x64 a fourth stage then fits in the H200's 227 KiB)."""
    _check_impl(impl, warp_specialize, flatten, tma_store, split_n)
    if swiglu and split_n != 1:
        raise ValueError("grouped GEMM: split_n is for plain products (swiglu already keeps two accumulators)")
    if a.dtype != b.dtype or out.dtype != a.dtype:
        raise ValueError(f"grouped_gemm: a, b and out must share one dtype, got {a.dtype}, {b.dtype}, {out.dtype}")
    if b.dim() != 3:
        raise ValueError(f"grouped_gemm: expected b [E, N, K], got {tuple(b.shape)}")
    if transpose_b:
        k_dim, n_dim = b.shape[1], b.shape[2]
        stride_bk, stride_bn = b.stride(1), b.stride(2)
    else:
        n_dim, k_dim = b.shape[1], b.shape[2]
        stride_bn, stride_bk = b.stride(1), b.stride(2)
    if swiglu:
        n_dim //= 2
    if a.shape[1] != k_dim or out.shape[1] != n_dim:
        raise ValueError(f"grouped_gemm: a {tuple(a.shape)}, b {tuple(b.shape)} and out {tuple(out.shape)} "
                         "do not chain")
    bm, bn, bk, warps, stages, group_m = config or default_config(a.device, swiglu)
    if bm != layout.block_m:
        raise ValueError(f"grouped_gemm: BLOCK_M {bm} differs from the layout's {layout.block_m}")
    if n_dim == 0 or out.shape[0] == 0:
        return out
    programs = programs or sm_count(a.device)
    flags = dict(A_ROW_DIV=a_row_div, GATHER_A=gather_a, SCATTER_C=scatter_c, SWIGLU=swiglu,
                 UPCAST=a.device.type != "cuda", IEEE=a.dtype == torch.float32, RNE=needs_rne(out),
                 BM=bm, BN=bn, BK=bk, GROUP_M=group_m, NUM_PROGRAMS=programs, num_warps=warps, num_stages=stages)
    b2d = b.view(-1, b.shape[2]) if b.is_contiguous() else None  # [E*N', K] or, transposed, [E*K, N]
    if impl != "ptr" and b2d is not None and _tma_ok(b2d) and (not transpose_b or k_dim % bk == 0):
        a_tma = _tma_ok(a) and (not gather_a or (layout.contiguous and a_row_div == 1))
        a_arg = TensorDescriptor.from_tensor(a, [bm, bk]) if a_tma else a
        bw = bn // split_n
        b_desc = TensorDescriptor.from_tensor(b2d, [bk, bw] if transpose_b else [bw, bk])
        c_tma = tma_store and _tma_ok(out) and (not scatter_c or layout.contiguous)
        c_desc = TensorDescriptor.from_tensor(out, [bm, bw]) if c_tma else None
        _grouped_gemm_tma_kernel[(programs,)](
            a_arg, b_desc, out, c_desc, layout.sorted_ids, layout.expert_ids, layout.num_padded, layout.n_valid, n_dim,
            k_dim, a.stride(0), a.stride(1), out.stride(0), out.stride(1), b.shape[1], A_TMA=a_tma, B_KN=transpose_b,
            WARP_SPECIALIZE=warp_specialize, FLATTEN=flatten,
            C_INT32=out.shape[0] * out.stride(0) + out.shape[1] * out.stride(1) < 2**31, C_TMA=c_tma, SPLIT_N=split_n,
            **flags)
        return out
    _grouped_gemm_kernel[(programs,)](
        a, b, out, layout.sorted_ids, layout.expert_ids, layout.num_padded, layout.n_valid, n_dim, k_dim,
        a.stride(0), a.stride(1), b.stride(0), stride_bn, stride_bk, out.stride(0), out.stride(1),
        n_dim * stride_bn, **flags)
    return out


def grouped_dw(dc: torch.Tensor, a: torch.Tensor, layout: Aligned, out: torch.Tensor, *, config=None,
               programs: int | None = None, impl: str = "auto") -> torch.Tensor:
    """out[e] = dc_e^T @ a_e over each expert's routed rows (rows of dc and a by sorted id): out [E, N, K].
    impl "tma" (or "auto") on a contiguous layout with descriptor-friendly dc and a: full row steps by TMA."""
    _check_impl(impl, False, False)
    experts, n_dim, k_dim = out.shape
    if dc.shape[1] != n_dim or a.shape[1] != k_dim or dc.dtype != a.dtype:
        raise ValueError(f"grouped_dw: dc {tuple(dc.shape)} and a {tuple(a.shape)} do not give {tuple(out.shape)}")
    # H200: 128 x 256 columns per program through TMA 607.6 TFLOP/s, 1.01x torch._grouped_mm; 128 x 128 561.5
    bn, bk, br, warps, stages = config or ((128, 128, 16, 4, 1) if a.device.type != "cuda" else (128, 256, 64, 8, 3))
    if layout.block_m % br:
        raise ValueError(f"grouped_dw: rows per step {br} must divide the layout's BLOCK_M {layout.block_m}")
    if out.numel() == 0:
        return out
    programs = programs or sm_count(a.device)
    flags = dict(UPCAST=a.device.type != "cuda", IEEE=a.dtype == torch.float32, RNE=needs_rne(out),
                 BN=bn, BK=bk, BR=br, NUM_PROGRAMS=programs, num_warps=warps, num_stages=stages)
    strides = (dc.stride(0), dc.stride(1), a.stride(0), a.stride(1), out.stride(0), out.stride(1), out.stride(2))
    if impl != "ptr" and layout.contiguous and _tma_ok(dc) and _tma_ok(a):
        _grouped_dw_tma_kernel[(programs,)](
            TensorDescriptor.from_tensor(dc, [br, bn]), TensorDescriptor.from_tensor(a, [br, bk]), dc, a, out,
            layout.expert_offset, layout.expert_count, experts, n_dim, k_dim, *strides, **flags)
        return out
    _grouped_dw_kernel[(programs,)](
        dc, a, out, layout.sorted_ids, layout.expert_start, layout.expert_count, layout.n_valid, experts, n_dim,
        k_dim, *strides, **flags)
    return out


def grouped_linear_fwd(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor, config=None,
                       **variant) -> torch.Tensor:
    """y[rows of e] = x[rows of e] @ weight[e]^T for x grouped by expert (expert e owns the next counts[e] rows);
    variant: grouped_gemm's impl / warp_specialize / flatten / tma_store / split_n / programs."""
    _check_grouped(x, weight, counts)
    if config is None and x.device.type == "cuda" and variant.get("impl", "auto") != "ptr":
        # H200: 256-row blocks through TMA, 3 stages, flattened tile loop. Under `crucible bench`'s sustained timer
        # (same GPU one after the other) 648.4 TFLOP/s, 1.09x the per-expert loop, against 625.7 / 1.03x for
        # 4 stages not flattened, although do_bench had those ahead: 727.9 against 666.3 (1.18x / 1.08x
        # torch._grouped_mm; 574 / 587 at 8x skew)
        config = LINEAR_CONFIG
        variant.setdefault("flatten", True)
    bm = (config or default_config(x.device))[0]
    layout = align_counts(counts, x.shape[0], bm)
    y = torch.empty((x.shape[0], weight.shape[1]), dtype=x.dtype, device=x.device)
    return grouped_gemm(x.contiguous(), weight, layout, y, config=config, **variant)


def _check_grouped(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> None:
    if x.dim() != 2 or weight.dim() != 3 or x.shape[1] != weight.shape[2]:
        raise ValueError(f"grouped linear: expected x [rows, H] and weight [E, F, H], got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if counts.shape != (weight.shape[0],) or counts.is_floating_point():
        raise ValueError(f"grouped linear: expected integer counts of shape [{weight.shape[0]}], got "
                         f"{tuple(counts.shape)} {counts.dtype}")


class ModelNew(torch.nn.Module):
    """tasks/moe_grouped_gemm.py: y = x_e @ W_e^T per expert, rows grouped by expert with counts[e] each."""

    def __init__(self, experts: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(experts, out_features, in_features, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return grouped_linear_fwd(x, self.weight.detach(), counts)
