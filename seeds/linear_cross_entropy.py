"""Fused linear + cross-entropy, forward and backward, that never materialises the full logits.

x: [BT, H], weight: [V, H] (an LM head: BT 8192, H 4096, V 128256 in bf16 in the task), target: [BT] int64.
Returns the loss (fp32 scalar), dx [BT, H] and dweight [V, H], the gradients of
    loss = cross_entropy((x @ weight^T).float(), target, ignore_index, label_smoothing, reduction).
With l = x W^T, lse_t = log sum_v exp(l_tv), g_t = 1/n_valid (mean) or 1 (sum), 0 for an ignored row, e = smoothing:
    loss_t = lse_t - (1 - e) l_t,target - (e / V) sum_v l_tv
    dl_tv  = g_t (exp(l_tv - lse_t) - e / V - (1 - e) [v == target_t])
    dx = dl W,  dweight = dl^T x.
FLOPs: 3 x 2 BT V H = 25.8 TFLOP at the task's shape (33 ms at the ~790 TFLOP/s cuBLAS has reached on an 8192^3
bf16 product; ANCHORS.md records 694-788). The task does not allow torch compute ops (no
CRUCIBLE_ALLOW_TORCH_COMPUTE), so every product is a Triton GEMM below.

Extra memory, as the bench measures it (peak allocated minus what was allocated before the call, outputs included):
dweight (1002 MiB) + dx (64 MiB) leave 60 MiB of the 1.1 GiB budget for everything else. Two forms:

"vocab" (the default): the vocabulary is the outer loop, so each row of dweight is written once, from a GEMM over all
    BT tokens (K = 8192), and dx is accumulated over a few large vocabulary chunks.
    1. stats: l = x W^T tile by tile (BM x BN), per tile row max / sum exp / sum, and the target's logit; nothing of
       l is kept except the first `store_chunks` chunks' columns, each stored by its own launch.
    2. a small kernel combines the tiles: lse, the per-row loss, g_t.
    3. per vocabulary chunk [v0, v1): dl = the gradient of l recomputed in the GEMM's epilogue (or converted in
       place from the stored logits), dweight[v0:v1] = dl^T x, dx (+)= dl W[v0:v1].
    dl lives in dweight's own tail while that is not written yet: a chunk of n columns fits when
    v1 H + n BT <= V H, i.e. n <= (V - v0) H / (H + BT) (a third of what is left at BT = 2 H), so the chunks
    shrink geometrically (42752, 28501, ... columns) until a fixed workspace (`workspace` bytes) holds the rest.
    Stored chunks: one buffer can hold V/3 of the logits; k buffers back to back, each freed once its chunk's
    dweight rows are written, hold (2^k - 1) V / (2^(k+1) - 1) at BT = 2 H (stored_ends): 3V/7 for two, 7V/15 for
    three. FLOPs: 3 products plus the recomputed logits: 34.4 TFLOP with none stored, 31.6 with one (42752
    columns), 30.8 with two, 30.4 with three (59648 columns: 8960 + 17920 + 32768); at most 30.1 (V/2 stored).
    Every GEMM stays large (M, N >= 4096; the smallest chunk has 1536-3072 columns); dweight written once, weight
    read 4 times, dx rounded to bf16 once per chunk (10 chunks with one stored, 11 with three).
    The GEMMs ("gemm"): "tma" loads the operand tiles through host TMA descriptors on a persistent grid (one
    program per SM walking the tiles in grouped order, tl.range(flatten=True) so the next tile's loads can overlap
    this tile's epilogue; warp_specialize=True as an option, which on Hopper needs flatten off); "ptr" is the
    pointer-load kernel with one program a tile. A product whose views break TMA's alignment rules (odd H, an
    odd-width last chunk) takes the pointer path. The epilogues (stats, recomputed gradient, dweight rows, dx
    accumulation) are the same code on both paths.
"token" (the earlier form): chunks of C tokens; per chunk the [C, V] logits, the cross-entropy kernel of
    seeds/cross_entropy.py in place, dx_c = dl W (split over K), dweight (+)= dl^T x_c. Every chunk reads weight
    twice and reads and writes dweight (4.2 GB a chunk); C V 2 B must fit the 60 MiB left, so C <= 240 at budget.

Measured on the H200 (torch 2.11, triton 3.6; benchmarks/bench_lce.py),
BT 8192, H 4096, V 128256 bf16, extra memory with the outputs inside it, all in one run:
    vocab form, TMA GEMMs, 3 stages, three stored chunks (the default)  46.18 ms  559 TFLOP/s  1.088 GiB
    vocab form, TMA GEMMs, 4 stages, three stored chunks             47.77 ms  541 TFLOP/s  1.088 GiB
    the same with warp_specialize                                   47.38 ms  545 TFLOP/s  1.088 GiB
    vocab form, TMA GEMMs, 4 stages, one stored chunk                51.79 ms  499 TFLOP/s  1.088 GiB
    vocab form, ptr GEMMs, 4 stages, three stored chunks             51.19 ms  504 TFLOP/s  1.088 GiB
    vocab form, ptr GEMMs, 4 stages, one stored chunk (the old path) 52.98 ms  487 TFLOP/s  1.088 GiB
    Liger Kernel 0.8.5 (cuBLAS GEMMs)                                53.78 ms  480 TFLOP/s  1.102 GiB
    eager (the task's Model)                                         48.57 ms  532 TFLOP/s  13.7 GiB
    torch.compile forward + autograd backward                        39.09 ms  661 TFLOP/s  3.0 GiB
(TFLOP/s over the 25.8 TFLOP minimum.) The seed is the fastest within the memory budget (1.05x eager, 1.16x Liger)
but misses the 45 ms target by 2.6% and is 0.85x torch.compile, which spends 3 GiB on full logits. The TMA GEMMs
reach 694-703 TFLOP/s on each product alone (the pointer kernel 535-706, its logits product the slow one), and the
form executes 30.4 TFLOP (three stored chunks) to the minimum 25.8: those 4.6 TFLOP of recomputed logits at ~700
TFLOP/s are the 6.6 ms between this seed and the GEMM-only bound, and what a closer target needs removed.
Those rows rounded dx to bf16 after each chunk's product; `crucible check` on the H200 then rejected the
seed on outlier inputs (3 of 33.5M dx elements past the elementwise bound, where the sum cancels). dx now sums in
fp32 (dx_fp32, the default): 128 MiB more, 1.213 GiB in all, over the 1.1 GiB budget. On a two-H200 machine whose
eager ran 7% slower than on the first: 50.67 ms against the bf16 sum's 49.24 in the same run (eager
51.96, Liger 54.29, torch.compile 41.41), and `crucible bench` accepted it: 51.11 ms, 0.953x eager (slower), 1.095x
Liger.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from seeds._common import grouped_tile, sm_count
from seeds.cross_entropy import ce_rows, count_valid, needs_rne, round_bf16_rne, sum_rows

CRUCIBLE_SEED = {
    "name": "linear_cross_entropy",
    "tasks": ["linear_cross_entropy.py"],
    "ops": ["fused linear + cross-entropy fwd+bwd (loss, dx, dW)"],
}

# Token form: bytes for the chunk's logits and split-K partials: 160 MiB gives 512-token chunks at V 128256, the
# fastest measured (59.0 ms at 1.18 GiB extra); 64 MiB (192 tokens, 1.09 GiB) took 101.5 ms and 256 tokens
# (1.11-1.12 GiB) 72.8-79.7 ms.
CHUNK_BUDGET = 160 << 20
# Vocab form: the fixed workspace (the last chunks' gradients, the stats of pass 1): 48 MiB keeps the total at
# 1.09 GiB at the task's shape (dweight 1002 MiB + dx 64 MiB + 48 MiB + four [BT] fp32 vectors).
VOCAB_WORKSPACE = 48 << 20
CHUNK_ALIGN = 256  # vocabulary chunks are whole GEMM tiles
STORED_ALIGN = 8   # stored chunks at small vocabularies: 8 columns keep their rows 16-byte aligned for TMA

MODE_STATS: tl.constexpr = tl.constexpr(0)
MODE_GRAD: tl.constexpr = tl.constexpr(1)


@dataclass(frozen=True)
class Gemm:
    """How the products run. tma: host TMA descriptors for the operand tiles and a persistent grid of `programs`
    (0: one per SM) walking the tiles in grouped order; where a view breaks TMA's rules (16-byte aligned base and
    row stride, unit inner stride) that product takes the pointer path. tma False: pointer loads, one program per
    tile (the path measured at 54.3 ms). warp_specialize and flatten are tl.range's options on the tile loop
    (Hopper's warp specialisation needs flatten off). subtile: every epilogue (a product's store, the logits' stats
    or gradient) works on the tile's two [BM, BN/2] column halves in turn, as Triton's persistent-matmul tutorial
    does (EPILOGUE_SUBTILE): half the registers and half the shared memory for the store's layout change, so a
    128 x 256 tile fits 4 stages of BK 64 beside a bf16 store and 3 beside an fp32 one (the fp32 dx
    product 681.5 TFLOP/s against 575.6 unsubtiled; whole step 47.88 ms, with 3 stages for logits/dW 47.41); the
    halves' stats are merged into the tile's (stats kept per half would double their workspace). group_m: row
    tiles per group of the grouped tile order (_swizzle). tma_store: a product whose output has the operands' dtype (the
    dweight rows) stores its tiles through a TMA descriptor where the output allows one (dx's fp32 accumulator and
    the logits epilogues keep pointer stores)."""
    tma: bool = True
    warp_specialize: bool = False
    flatten: bool = True
    programs: int = 0
    subtile: bool = False
    group_m: int = 8
    tma_store: bool = False


PTR = Gemm(tma=False)


@triton.jit
def _swizzle(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of tile pid: groups of GROUP_M row tiles walk the column tiles together, so the
    column operand's tiles are reused from L2."""
    return grouped_tile(pid, tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)


@triton.jit
def _halves(acc, BM: tl.constexpr, BN: tl.constexpr):
    """acc[:, :BN/2] and acc[:, BN/2:] of a [BM, BN] tile."""
    return tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b in fp32. IEEE: full fp32 products for fp32 inputs (tf32 would fail an fp32 tolerance). UPCAST:
    multiply in fp32 (the CPU interpreter, whose bf16 tl.dot is wrong in Triton 3.9; bf16/fp16 products are exact
    in fp32)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _tile_product(A, B, rm, rn, M, N, k_lo, k_hi, stride_am, stride_ak, stride_bk, stride_bn,
                  IEEE: tl.constexpr, UPCAST: tl.constexpr, EVEN_K: tl.constexpr, BM: tl.constexpr,
                  BN: tl.constexpr, BK: tl.constexpr):
    """A[rm, k_lo:k_hi] @ B[k_lo:k_hi, rn] in fp32 from pointer loads. EVEN_K: (k_hi - k_lo) is a multiple of BK
    (no mask along K)."""
    rk = tl.arange(0, BK)
    a_ptrs = A + rm[:, None].to(tl.int64) * stride_am + (k_lo + rk)[None, :].to(tl.int64) * stride_ak
    b_ptrs = B + (k_lo + rk)[:, None].to(tl.int64) * stride_bk + rn[None, :].to(tl.int64) * stride_bn
    m_ok = rm[:, None] < M
    n_ok = rn[None, :] < N
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in range(k_lo, k_hi, BK):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=m_ok, other=0.0)
            b = tl.load(b_ptrs, mask=n_ok, other=0.0)
        else:
            k_ok = (k + rk) < k_hi
            a = tl.load(a_ptrs, mask=m_ok & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok, other=0.0)
        acc = _dot(a, b, acc, IEEE, UPCAST)
        a_ptrs += BK * stride_ak
        b_ptrs += BK * stride_bk
    return acc


@triton.jit
def _tma_tile_product(a_desc, b_desc, off_m, off_n, K, A_T: tl.constexpr, B_T: tl.constexpr,
                      IEEE: tl.constexpr, UPCAST: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                      BK: tl.constexpr):
    """A[off_m:+BM, :K] @ B[:K, off_n:+BN] in fp32 from TMA tiles (out-of-bounds rows and columns read as zeros, so
    no masks). a_desc describes A [M, K], or A^T [K, M] when A_T; b_desc describes B [K, N], or B^T [N, K] when
    B_T: the transposed tile is a view of shared memory, which the tensor cores read in either order."""
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for ki in range(tl.cdiv(K, BK)):
        off_k = ki * BK
        if A_T:
            a = a_desc.load([off_k, off_m]).T
        else:
            a = a_desc.load([off_m, off_k])
        if B_T:
            b = b_desc.load([off_n, off_k]).T
        else:
            b = b_desc.load([off_k, off_n])
        acc = _dot(a, b, acc, IEEE, UPCAST)
    return acc


@triton.jit
def _persistent_tile(a_desc, b_desc, tile, tile_c, n_programs, M, N, K, A_T: tl.constexpr, B_T: tl.constexpr,
                     IEEE: tl.constexpr, UPCAST: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     GROUP_M: tl.constexpr):
    """One step of a persistent TMA loop: (the product of tile `tile`, the epilogue's tile counter advanced, that
    tile's rows, row block and column block). The epilogue's index is a second counter (tile_c), not the loop
    variable, as Triton's persistent-matmul tutorial does, so a flattened or specialised loop keeps its loads and
    its epilogue independent."""
    pid_m, pid_n = _swizzle(tile, M, N, BM, BN, GROUP_M)
    acc = _tma_tile_product(a_desc, b_desc, pid_m * BM, pid_n * BN, K, A_T, B_T, IEEE, UPCAST, BM, BN, BK)
    tile_c += n_programs
    pid_m, pid_n = _swizzle(tile_c, M, N, BM, BN, GROUP_M)
    return acc, tile_c, pid_m * BM + tl.arange(0, BM), pid_m, pid_n


@triton.jit
def _store_tile(C, acc, rm, rn, M, N, stride_cm, stride_cn, ACCUMULATE: tl.constexpr, RNE: tl.constexpr):
    """C[rm, rn] (+)= acc, masked to [M, N]. RNE: round to nearest bf16 before the store (the interpreter
    truncates)."""
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    c_ptrs = C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :].to(tl.int64) * stride_cn
    if ACCUMULATE:
        acc += tl.load(c_ptrs, mask=mask).to(tl.float32)
    if RNE:
        acc = round_bf16_rne(acc)
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask)


@triton.jit
def _store_part(C, c_desc, acc, rm, off_m, off_n, M, N, stride_cm, stride_cn, ACCUMULATE: tl.constexpr,
                RNE: tl.constexpr, BN: tl.constexpr, TMA_STORE: tl.constexpr):
    """C[off_m:, off_n:] (+)= acc ([BM, BN]) through pointers (_store_tile) or the TMA descriptor c_desc of C (its
    block [BM, BN]; out-of-bounds rows and columns read as zeros and are not written)."""
    if TMA_STORE:
        if ACCUMULATE:
            acc += c_desc.load([off_m, off_n]).to(tl.float32)
        if RNE:
            acc = round_bf16_rne(acc)
        c_desc.store([off_m, off_n], acc.to(C.dtype.element_ty))
    else:
        _store_tile(C, acc, rm, off_n + tl.arange(0, BN), M, N, stride_cm, stride_cn, ACCUMULATE, RNE)


@triton.jit
def _store_tiles(C, c_desc, acc, rm, pid_m, pid_n, M, N, stride_cm, stride_cn, ACCUMULATE: tl.constexpr,
                 RNE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SUBTILE: tl.constexpr,
                 TMA_STORE: tl.constexpr):
    """Tile (pid_m, pid_n) of C (+)= acc, whole or (SUBTILE) as two [BM, BN/2] halves."""
    if SUBTILE:
        lo, hi = _halves(acc, BM, BN)
        _store_part(C, c_desc, lo, rm, pid_m * BM, pid_n * BN, M, N, stride_cm, stride_cn, ACCUMULATE, RNE, BN // 2,
                    TMA_STORE)
        _store_part(C, c_desc, hi, rm, pid_m * BM, pid_n * BN + BN // 2, M, N, stride_cm, stride_cn, ACCUMULATE,
                    RNE, BN // 2, TMA_STORE)
    else:
        _store_part(C, c_desc, acc, rm, pid_m * BM, pid_n * BN, M, N, stride_cm, stride_cn, ACCUMULATE, RNE, BN,
                    TMA_STORE)


@triton.jit
def _matmul_kernel(
    A, B, C,  # C[s] = A[:, K_s] @ B[K_s, :] for split s (program axis 1), or C (+)= A @ B with one split
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    stride_cs,    # elements between the splits' partial outputs
    k_per_split,  # a multiple of BK
    ACCUMULATE: tl.constexpr,  # add the product to what C holds
    IEEE: tl.constexpr, UPCAST: tl.constexpr, EVEN_K: tl.constexpr, RNE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = _swizzle(tl.program_id(0), M, N, BM, BN, GROUP_M)
    split = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    k_lo = split * k_per_split
    k_hi = min(K, k_lo + k_per_split)
    acc = _tile_product(A, B, rm, rn, M, N, k_lo, k_hi, stride_am, stride_ak, stride_bk, stride_bn,
                        IEEE, UPCAST, EVEN_K, BM, BN, BK)
    _store_tile(C + split.to(tl.int64) * stride_cs, acc, rm, rn, M, N, stride_cm, stride_cn, ACCUMULATE, RNE)


@triton.jit
def _tma_matmul_kernel(
    a_desc, b_desc,  # TMA descriptors of A (or A^T when A_T) and B (or B^T when B_T)
    C, c_desc,       # C, and with TMA_STORE its descriptor (blocks of [BM, BN], or [BM, BN/2] with SUBTILE)
    M, N, K, stride_cm, stride_cn,
    n_programs,      # the persistent grid: program p takes tiles p, p + n_programs, ...
    ACCUMULATE: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, RNE: tl.constexpr,
    A_T: tl.constexpr, B_T: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, SUBTILE: tl.constexpr, TMA_STORE: tl.constexpr,
):
    """C (+)= A @ B, persistent (_persistent_tile)."""
    start = tl.program_id(0)
    num_tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    tile_c = start - n_programs
    for tile in tl.range(start, num_tiles, n_programs, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        acc, tile_c, rm, pid_m, pid_n = _persistent_tile(a_desc, b_desc, tile, tile_c, n_programs, M, N, K, A_T,
                                                         B_T, IEEE, UPCAST, BM, BN, BK, GROUP_M)
        _store_tiles(C, c_desc, acc, rm, pid_m, pid_n, M, N, stride_cm, stride_cn, ACCUMULATE, RNE, BM, BN, SUBTILE,
                     TMA_STORE)


@triton.jit
def _sum_splits_kernel(P, OUT, n_elements, splits, RNE: tl.constexpr, BLOCK: tl.constexpr):
    """OUT = sum over s of P[s] (P: [splits, n_elements] fp32), in split order."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, splits):
        acc += tl.load(P + s * n_elements + offs, mask=mask, other=0.0)
    if RNE:
        acc = round_bf16_rne(acc)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _part_stats(acc, rm, rn, target, DL, stride_dl, M, N, v0, STORE: tl.constexpr):
    """(row max, sum exp(l - max), sum l, the target's logit or 0) over the columns rn of rounded logits acc (a
    part with no column inside N: max -inf, sums 0); with STORE, the logits into DL."""
    n_ok = rn < N
    logit = tl.where(n_ok[None, :], acc, float("-inf"))
    mx = tl.max(logit, axis=1)
    shift = tl.where(mx == float("-inf"), 0.0, mx)
    sum_exp = tl.sum(tl.exp(logit - shift[:, None]), axis=1)
    sum_l = tl.sum(tl.where(n_ok[None, :], acc, 0.0), axis=1)
    hit = (v0 + rn)[None, :] == target[:, None]
    tgt = tl.sum(tl.where(hit, acc, 0.0), axis=1)
    if STORE:
        tl.store(DL + rm[:, None].to(tl.int64) * stride_dl + rn[None, :], acc.to(DL.dtype.element_ty),
                 mask=(rm < M)[:, None] & n_ok[None, :])
    return mx, sum_exp, sum_l, tgt


@triton.jit
def _part_grad(acc, rm, rn, target, LSE, ROW_SCALE, DL, stride_dl, M, N, v0, V, smoothing, RNE: tl.constexpr):
    """The gradient of rounded logits acc (columns rn) into DL."""
    m_ok = rm < M
    lse = tl.load(LSE + rm, mask=m_ok, other=0.0)
    scale = tl.load(ROW_SCALE + rm, mask=m_ok, other=0.0)
    hit = (v0 + rn)[None, :] == target[:, None]
    grad = (tl.exp(acc - lse[:, None]) - smoothing / V - tl.where(hit, 1.0 - smoothing, 0.0)) * scale[:, None]
    if RNE:
        grad = round_bf16_rne(grad)
    tl.store(DL + rm[:, None].to(tl.int64) * stride_dl + rn[None, :], grad.to(DL.dtype.element_ty),
             mask=m_ok[:, None] & (rn < N)[None, :])


@triton.jit
def _logits_epilogue(acc, rm, pid_n, TARGET, STATS, TGT_LOGIT, LSE, ROW_SCALE, DL, stride_dl, M, N, v0, V,
                     tile_base, n_tiles, smoothing, MODE: tl.constexpr, SMOOTH: tl.constexpr,
                     STORE: tl.constexpr, RNE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                     SUBTILE: tl.constexpr):
    """One [BM, BN] tile of logits l = x W[v0:v0+N]^T (column tile pid_n of the launch): its stats (MODE_STATS: row
    max, sum exp(l - max), sum l into column tile tile_base + pid_n of STATS [3, n_tiles, M]; the target's logit;
    with STORE, l itself into DL) or its gradient into DL (MODE_GRAD). SUBTILE: the work in two [BM, BN/2] halves,
    their stats merged into the tile's."""
    # Logits rounded to the input dtype, as F.linear returns them: the stats, the stored logits and the recomputed
    # ones then agree exactly (an fp32 lse with rounded stored logits is off by up to half a bf16 ulp of a large
    # logit inside exp), and the result has PyTorch's error, not more.
    if RNE:
        acc = round_bf16_rne(acc)
    acc = acc.to(DL.dtype.element_ty).to(tl.float32)
    m_ok = rm < M
    target = tl.load(TARGET + rm, mask=m_ok, other=-1)
    rn = pid_n * BN + tl.arange(0, BN // 2 if SUBTILE else BN)
    if SUBTILE:
        lo, hi = _halves(acc, BM, BN)
    if MODE == MODE_STATS:
        if SUBTILE:
            mx, sum_exp, sum_l, tgt = _part_stats(lo, rm, rn, target, DL, stride_dl, M, N, v0, STORE)
            mx_hi, sum_exp_hi, sum_l_hi, tgt_hi = _part_stats(hi, rm, rn + BN // 2, target, DL, stride_dl, M, N,
                                                              v0, STORE)
            both = tl.maximum(mx, mx_hi)
            sum_exp = sum_exp * tl.exp(mx - both) + sum_exp_hi * tl.exp(mx_hi - both)
            mx, sum_l, tgt = both, sum_l + sum_l_hi, tgt + tgt_hi
        else:
            mx, sum_exp, sum_l, tgt = _part_stats(acc, rm, rn, target, DL, stride_dl, M, N, v0, STORE)
        stat = STATS + (tile_base + pid_n).to(tl.int64) * M + rm
        tl.store(stat, mx, mask=m_ok)
        tl.store(stat + n_tiles * M, sum_exp, mask=m_ok)
        if SMOOTH:
            tl.store(stat + 2 * n_tiles * M, sum_l, mask=m_ok)
        tile_lo = v0 + pid_n * BN
        in_tile = (target >= tile_lo) & (target < tile_lo + BN) & (target < v0 + N)
        tl.store(TGT_LOGIT + rm, tgt, mask=m_ok & in_tile)
    else:
        if SUBTILE:
            _part_grad(lo, rm, rn, target, LSE, ROW_SCALE, DL, stride_dl, M, N, v0, V, smoothing, RNE)
            _part_grad(hi, rm, rn + BN // 2, target, LSE, ROW_SCALE, DL, stride_dl, M, N, v0, V, smoothing, RNE)
        else:
            _part_grad(acc, rm, rn, target, LSE, ROW_SCALE, DL, stride_dl, M, N, v0, V, smoothing, RNE)


@triton.jit
def _vocab_logits_kernel(
    X, W,           # x [M, K], weight rows v0 .. v0 + N [N, K] (both with unit column stride)
    TARGET, STATS,  # STATS: [3, n_tiles, M] fp32 (tile max, tile sum exp(l - max), tile sum l)
    TGT_LOGIT,      # [M] fp32 l[t, target_t], written by the tile holding the target
    LSE, ROW_SCALE,  # [M] fp32 (MODE_GRAD)
    DL, stride_dl,  # [M, N] logits (MODE_STATS with STORE) or their gradient (MODE_GRAD)
    M, N, K, v0, V, stride_xm, stride_wv, tile_base, n_tiles, smoothing,
    MODE: tl.constexpr, SMOOTH: tl.constexpr, STORE: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, EVEN_K: tl.constexpr, RNE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, SUBTILE: tl.constexpr,
):
    """Logits tile by tile from pointer loads (one program a tile); the epilogue reduces or differentiates them."""
    pid_m, pid_n = _swizzle(tl.program_id(0), M, N, BM, BN, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    # B[k, n] = W[n, k]
    acc = _tile_product(X, W, rm, rn, M, N, 0, K, stride_xm, 1, 1, stride_wv, IEEE, UPCAST, EVEN_K, BM, BN, BK)
    _logits_epilogue(acc, rm, pid_n, TARGET, STATS, TGT_LOGIT, LSE, ROW_SCALE, DL, stride_dl, M, N, v0, V,
                     tile_base, n_tiles, smoothing, MODE, SMOOTH, STORE, RNE, BM, BN, SUBTILE)


@triton.jit
def _tma_logits_kernel(
    x_desc, w_desc,  # TMA descriptors of x [M, K] and weight rows v0 .. v0 + N [N, K]
    TARGET, STATS, TGT_LOGIT, LSE, ROW_SCALE, DL, stride_dl,  # as in _vocab_logits_kernel
    M, N, K, v0, V, tile_base, n_tiles, smoothing, n_programs,
    MODE: tl.constexpr, SMOOTH: tl.constexpr, STORE: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, RNE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, SUBTILE: tl.constexpr,
):
    """_vocab_logits_kernel from TMA tiles on a persistent grid (tiles p, p + n_programs, ...)."""
    start = tl.program_id(0)
    num_tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    tile_c = start - n_programs
    for tile in tl.range(start, num_tiles, n_programs, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        acc, tile_c, rm, _, pid_n = _persistent_tile(x_desc, w_desc, tile, tile_c, n_programs, M, N, K, False, True,
                                                     IEEE, UPCAST, BM, BN, BK, GROUP_M)
        _logits_epilogue(acc, rm, pid_n, TARGET, STATS, TGT_LOGIT, LSE, ROW_SCALE, DL, stride_dl, M, N, v0, V,
                         tile_base, n_tiles, smoothing, MODE, SMOOTH, STORE, RNE, BM, BN, SUBTILE)


@triton.jit
def _lse_kernel(STATS, TGT_LOGIT, TARGET, N_VALID, LSE, ROW_SCALE, LOSS_ROWS, M, n_tiles, V, ignore_index,
                smoothing, SMOOTH: tl.constexpr, MEAN: tl.constexpr, BLOCK: tl.constexpr):
    """Per row: lse from the tiles' (max, sum exp) in tile order, the loss, and the gradient scale g_t."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < M
    m = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    sx = tl.zeros([BLOCK], dtype=tl.float32)
    for j in range(0, n_tiles):
        mj = tl.load(STATS + j * M + rows, mask=ok, other=0.0)
        sj = tl.load(STATS + (n_tiles + j) * M + rows, mask=ok, other=0.0)
        new_m = tl.maximum(m, mj)
        s = s * tl.exp(m - new_m) + sj * tl.exp(mj - new_m)
        m = new_m
        if SMOOTH:
            sx += tl.load(STATS + (2 * n_tiles + j) * M + rows, mask=ok, other=0.0)
    lse = m + tl.log(s)
    target = tl.load(TARGET + rows, mask=ok, other=ignore_index)
    valid = ok & (target != ignore_index)
    x_target = tl.load(TGT_LOGIT + rows, mask=valid, other=0.0)
    loss = (1.0 - smoothing) * (lse - x_target) + smoothing * (lse - sx / V)
    if MEAN:
        g = 1.0 / tl.load(N_VALID)
    else:
        g = 1.0
    tl.store(LSE + rows, lse, mask=ok)
    tl.store(ROW_SCALE + rows, tl.where(valid, g, 0.0), mask=ok)
    tl.store(LOSS_ROWS + rows, tl.where(valid, loss, 0.0), mask=ok)


@triton.jit
def _logits_to_grad_kernel(DL, stride_dl, TARGET, LSE, ROW_SCALE, N, v0, V, smoothing, RNE: tl.constexpr,
                           BLOCK: tl.constexpr):
    """In place: stored logits of columns [v0, v0 + N) -> their gradient (program: one row, BLOCK columns)."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    ptrs = DL + row.to(tl.int64) * stride_dl + cols
    lse = tl.load(LSE + row)
    scale = tl.load(ROW_SCALE + row)
    target = tl.load(TARGET + row)
    l = tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)
    grad = (tl.exp(l - lse) - smoothing / V - tl.where(v0 + cols == target, 1.0 - smoothing, 0.0)) * scale
    if RNE:
        grad = round_bf16_rne(grad)
    tl.store(ptrs, grad.to(DL.dtype.element_ty), mask=ok)


# ---------------------------------------------------------------------------------------------------------------
def _default_config(device: torch.device, elem_bytes: int = 2, tma: bool = False,
                    out_bytes: int = 2, subtile: bool = False) -> tuple[int, int, int, int, int]:
    """(BM, BN, BK, warps, stages): Hopper-sized tiles on a GPU (the H200's best, docs/bench-lce.md: 4 stages of
    48 KiB for the pointer-path products, 3 with TMA loads: 46.18 ms against 47.77 for the whole step), small ones
    on the interpreter. An fp32 output (dx summed over the chunks in fp32) needs 128 KiB of shared memory for its
    128 x 256 epilogue tile, so its products take BK 32 with 3 stages (3 stages of BK 64 asked for 272 KiB of the
    H200's 227; the dx product alone: BK 32 s3 4.93 ms, BK 64 s2 5.27, 128 x 128 s4 5.18).
    fp32 inputs (not the task's dtype, not measured) get BK 32 and 128-column tiles, so their stages fit the
    same memory. A subtiled epilogue (Gemm.subtile, TMA) stages half the output tile: BK 64 with 3 stages beside
    an fp32 output, 4 beside a bf16 one (3 for the bf16 outputs too was the faster whole step)."""
    if device.type != "cuda":
        return (64, 64, 64, 4, 1)
    if elem_bytes > 2:
        return (128, 128, 32, 8, 3)
    if tma and subtile:
        return (128, 256, 64, 8, 3 if out_bytes > 2 else 4)
    if out_bytes > 2:
        return (128, 256, 32, 8, 3)
    return (128, 256, 64, 8, 3 if tma else 4)


def _flags(a: torch.Tensor) -> dict:
    # bf16 and fp16 products are exact in fp32, so upcasting on the interpreter changes no result.
    return dict(IEEE=a.dtype == torch.float32, UPCAST=a.device.type != "cuda")


def _tma_ready(*views: torch.Tensor) -> bool:
    """Whether TMA can load each 2-D view: unit inner stride, 16-byte aligned base and row stride, no empty dim.
    Odd hidden sizes or vocabulary chunks fail it; their products take the pointer path."""
    for t in views:
        if (t.dim() != 2 or min(t.shape) == 0 or t.stride(1) != 1 or t.data_ptr() % 16
                or (t.stride(0) * t.element_size()) % 16):
            return False
    return True


def _programs(gemm: Gemm, device: torch.device, tiles: int) -> int:
    return max(1, min(tiles, gemm.programs or sm_count(device)))


def _tiles(config: tuple[int, int, int, int, int], group_m: int = 8) -> dict:
    bm, bn, bk, warps, stages = config
    return dict(BM=bm, BN=bn, BK=bk, GROUP_M=group_m, num_warps=warps, num_stages=stages)


def _persistent(gemm: Gemm, config: tuple[int, int, int, int, int]) -> dict:
    return dict(**_tiles(config, gemm.group_m), FLATTEN=gemm.flatten, WARP_SPECIALIZE=gemm.warp_specialize,
                SUBTILE=gemm.subtile)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, accumulate: bool = False, split_k: int = 1,
           config: tuple[int, int, int, int, int] | None = None, partials: torch.Tensor | None = None,
           gemm: Gemm = PTR) -> None:
    """out (+)= a @ b for 2-D views with any strides; `config` = (BM, BN, BK, warps, stages). With gemm.tma (one
    split), a view with unit stride along either dimension whose rows TMA can load goes through descriptors.
    With split_k > 1 (pointer path), the flat fp32 buffer `partials` (at least split_k M N elements) receives the
    split products and `out` (contiguous) their sum."""
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return
    config = config or _default_config(a.device, a.element_size(), gemm.tma and split_k == 1, out.element_size(),
                                       gemm.subtile)
    bm, bn, bk = config[:3]
    if gemm.tma and split_k == 1:
        a_t = a.stride(1) != 1 and a.stride(0) == 1  # A is read as the rows of A^T [K, M]
        b_t = b.stride(1) != 1 and b.stride(0) == 1  # B is read as the rows of B^T [N, K]
        a_rows, b_rows = (a.t() if a_t else a), (b.t() if b_t else b)
        if _tma_ready(a_rows, b_rows):
            a_desc = TensorDescriptor.from_tensor(a_rows, [bk, bm] if a_t else [bm, bk])
            b_desc = TensorDescriptor.from_tensor(b_rows, [bn, bk] if b_t else [bk, bn])
            programs = _programs(gemm, a.device, triton.cdiv(M, bm) * triton.cdiv(N, bn))
            # TMA stores for outputs in the operands' dtype (dweight rows): the fp32 dx accumulator's TMA load and
            # store buffers do not fit beside 3 stages of BK 64 (279 KiB compiled for sm_90 by Triton 3.9)
            tma_store = gemm.tma_store and out.dtype == a.dtype and _tma_ready(out)
            c_desc = TensorDescriptor.from_tensor(out, [bm, bn // 2 if gemm.subtile else bn]) if tma_store else out
            _tma_matmul_kernel[(programs,)](a_desc, b_desc, out, c_desc, M, N, K, out.stride(0), out.stride(1),
                                            programs, ACCUMULATE=accumulate, RNE=needs_rne(out), A_T=a_t, B_T=b_t,
                                            TMA_STORE=tma_store, **_flags(a), **_persistent(gemm, config))
            return
    k_per_split = triton.cdiv(triton.cdiv(K, split_k), bk) * bk if K else bk
    split_k = max(1, triton.cdiv(K, k_per_split)) if K else 1
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), split_k)
    common = dict(**_flags(a), EVEN_K=K % bk == 0, **_tiles(config))
    if split_k == 1:
        _matmul_kernel[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                             out.stride(1), 0, k_per_split, ACCUMULATE=accumulate, RNE=needs_rne(out), **common)
        return
    if accumulate or not out.is_contiguous():
        raise ValueError("matmul: split-K writes a fresh contiguous output")
    p = partials[: split_k * M * N]
    _matmul_kernel[grid](a, b, p, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), N, 1, M * N,
                         k_per_split, ACCUMULATE=False, RNE=False, **common)
    _sum_splits_kernel[(triton.cdiv(M * N, 1024),)](p, out, M * N, split_k, RNE=needs_rne(out), BLOCK=1024,
                                                    num_warps=4)


def default_chunk(n_tokens: int, v: int, h: int, split_k: int, elem_bytes: int) -> int:
    """Token form: the largest power of two (at least 64) of tokens whose logits and partials fit CHUNK_BUDGET."""
    per_token = v * elem_bytes + split_k * h * 4
    fit = max(1, CHUNK_BUDGET // per_token)
    chunk = max(64, 1 << (fit.bit_length() - 1))
    return min(chunk, max(1, n_tokens))


def stored_ends(bt: int, h: int, v: int, k: int) -> list[int]:
    """Vocab form: the column ends P_0 < ... of the (at most k) first chunks whose logits pass 1 keeps, covering the
    most columns that fit in dweight's unwritten tail. Their buffers lie back to back from base = v h - P_last bt
    (chunk i's [bt, n_i] at base + bt P_(i-1)); chunk i's buffer lives until dweight rows [0, P_i) are written, so
    it must start at or after P_i h. For a given total the largest P_i that fits is taken in turn (a larger P_i
    only moves the next buffer later); the total is the largest that k chunks reach. At BT = 2H the optimum is
    P_i = (2^(i+1) - 1) V / (2^(k+1) - 1): V/3 for one chunk, 3V/7 for two, 7V/15 for three (at most V/2)."""
    if k <= 0 or bt == 0 or v == 0:
        return []
    r = bt / h
    g = sum(r ** j for j in range(k))
    align = CHUNK_ALIGN if v / (1 + r * g) >= CHUNK_ALIGN else STORED_ALIGN

    def fit(total: int) -> list[int] | None:
        base = (v * h - total * bt) // 8 * 8  # 16-byte aligned for bf16
        ends, prev = [], 0
        for _ in range(k):
            room = (base + bt * prev) // h
            p = min(total, room // align * align)
            if p <= prev:
                return None
            ends.append(p)
            prev = p
            if p == total:
                return ends
        return None

    total = min(v // align * align, (int(v * g / (1 + r * g)) // align + 1) * align)
    while total > 0:
        ends = fit(total)
        if ends:
            return ends
        total -= align
    return []


def vocab_chunks(bt: int, h: int, v: int, ws_cols: int, stored: int = 1,
                 align: int = CHUNK_ALIGN) -> tuple[list[tuple[int, int, int]], int]:
    """Vocab form: (v0, v1, start) per chunk, start = the element offset of its [bt, v1 - v0] gradient in dweight's
    flat storage, or -1 for the workspace; and how many leading chunks keep pass 1's logits (stored_ends). A chunk
    in dweight's tail must end before its buffer: v1 h <= start."""
    ends = stored_ends(bt, h, v, stored)
    chunks, v0 = [], 0
    if ends:
        base = (v * h - ends[-1] * bt) // 8 * 8
        for end in ends:
            chunks.append((v0, end, base + bt * v0))
            v0 = end
    while v0 < v:
        n = (v - v0) * h // (h + bt)
        n = n // align * align if n >= align else n
        if n > ws_cols and n > 0:
            start = (v * h - n * bt) // 8 * 8  # 16-byte aligned for bf16
            if start >= (v0 + n) * h:
                chunks.append((v0, v0 + n, start))
                v0 += n
                continue
        n = min(max(1, ws_cols), v - v0)
        chunks.append((v0, v0 + n, -1))
        v0 += n
    return chunks, len(ends)


def _token_form(x, weight, target, ignore_index, label_smoothing, mean, chunk, split_k, logits_config, dx_config,
                dw_config, fused_ce):
    bt, h = x.shape
    v = weight.shape[0]
    if split_k is None:
        split_k = 2 if x.is_cuda else 3
    dx = torch.empty_like(x)
    dw = torch.empty_like(weight) if bt else torch.zeros_like(weight)
    loss_rows = torch.empty(bt, dtype=torch.float32, device=x.device)
    n_valid = count_valid(target, ignore_index)
    c = chunk or default_chunk(bt, v, h, split_k, x.element_size())
    logits = torch.empty((min(c, bt), v), dtype=x.dtype, device=x.device)
    partials = torch.empty(split_k * min(c, bt) * h, dtype=torch.float32, device=x.device) if split_k > 1 else None
    for i, r0 in enumerate(range(0, bt, c)):
        r1 = min(bt, r0 + c)
        lc, xc = logits[: r1 - r0], x[r0:r1]
        matmul(xc, weight.t(), lc, config=logits_config)
        ce_rows(lc, target[r0:r1], lc, loss_rows[r0:r1], n_valid, ignore_index, label_smoothing, mean,
                fused=fused_ce)
        matmul(lc, weight, dx[r0:r1], split_k=split_k, config=dx_config, partials=partials)
        matmul(lc.t(), xc, dw, accumulate=i > 0, config=dw_config)
    return sum_rows(loss_rows, n_valid, mean), dx, dw


def dx_tail_rows(bt: int, h: int, v: int, elem_bytes: int, split: bool = False) -> int:
    """Vocab form with dx_in_dweight: the rows of dweight at its end whose storage holds the fp32 dx accumulator
    (split: its second half of columns, the first being in dx's own storage) until they are written last (the main
    vocabulary ending on a multiple of 8 rows keeps the accumulator 16-byte aligned); 0 where the accumulator would
    not leave a row of vocabulary before it."""
    need = triton.cdiv(bt * h * (2 if split else 4), h * elem_bytes)
    main = (v - need) // 8 * 8
    return v - main if main > 0 else 0


def _round_split_dx(dx: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, scratch: torch.Tensor) -> None:
    """dx = the fp32 sums lo (dx's columns [0, H/2), held in dx's own storage) and hi ([H/2, H)), rounded: row t of
    dx is the same bytes as row t of lo, so each block of rows goes through `scratch` (any dtype, at least H/2 fp32)
    before its rows are overwritten."""
    bt, hh = lo.shape
    rows = min(bt, scratch.numel() * scratch.element_size() // (4 * hh))
    if rows:
        buf = scratch[: rows * hh * 4 // scratch.element_size()].view(torch.float32).view(rows, hh)
    else:  # a workspace smaller than a row (tiny token counts): one row apart
        rows, buf = 1, torch.empty(1, hh, dtype=torch.float32, device=dx.device)
    for r0 in range(0, bt, rows):
        r1 = min(bt, r0 + rows)
        buf[: r1 - r0].copy_(lo[r0:r1])
        dx[r0:r1, hh:].copy_(hi[r0:r1])
        dx[r0:r1, :hh].copy_(buf[: r1 - r0])


def _vocab_form(x, weight, target, ignore_index, label_smoothing, mean, logits_config, dx_config, dw_config,
                workspace, store_chunks, gemm, dx_fp32=True, dx_in_dweight=False, dx_split=False):
    bt, h = x.shape
    v = weight.shape[0]
    dev = x.device
    dx = torch.empty_like(x)
    dw = torch.empty_like(weight)
    n_valid = count_valid(target, ignore_index)
    vec = torch.empty(4, bt, dtype=torch.float32, device=dev)
    lse, row_scale, loss_rows, tgt_logit = vec[0], vec[1], vec[2], vec[3]
    if bt == 0:
        dw.zero_()
        return sum_rows(loss_rows, n_valid, mean), dx, dw
    config = logits_config or _default_config(dev, x.element_size(), gemm.tma, subtile=gemm.subtile)
    bm, bn, bk = config[:3]
    smooth = label_smoothing != 0.0
    budget = VOCAB_WORKSPACE if workspace is None else workspace
    ws_cols = max(1, budget // (bt * x.element_size()))
    if ws_cols >= CHUNK_ALIGN:
        ws_cols = ws_cols // CHUNK_ALIGN * CHUNK_ALIGN
    # dx_in_dweight: the fp32 dx accumulator lives in dweight's last `tail` rows, which are written last (their
    # gradient recomputed once more for it); the chunks then cover the vocabulary before them. dx_split (a 2-byte
    # dtype, H even): the accumulator's columns [0, H/2) in dx's own storage (as many bytes), [H/2, H) in BT rows.
    in_dw = dx_in_dweight and dx_fp32 and dx.dtype != torch.float32
    split = in_dw and dx_split and dx.element_size() == 2 and h % 2 == 0
    tail = dx_tail_rows(bt, h, v, dw.element_size(), split) if in_dw else 0
    split = split and tail > 0
    v_main = v - tail
    chunks, n_stored = vocab_chunks(bt, h, v_main, ws_cols, store_chunks)
    # Pass 1 launches: one per stored chunk (its logits kept in its buffer), then the rest of the vocabulary.
    passes = [(v0, v1, start) for v0, v1, start in chunks[:n_stored]]
    if not passes or passes[-1][1] < v:
        passes.append((passes[-1][1] if passes else 0, v, -1))
    n_tiles = sum(triton.cdiv(v1 - v0, bn) for v0, v1, _ in passes)
    stats_words = (3 if smooth else 2) * n_tiles * bt
    ws_elems = max(ws_cols * bt, triton.cdiv(stats_words * 4, x.element_size()))
    ws = torch.empty(ws_elems, dtype=x.dtype, device=dev)
    stats = ws.view(torch.float32) if x.element_size() == 4 else ws[: ws_elems - ws_elems % 2].view(torch.float32)
    flat = dw.view(-1)
    common = dict(**_flags(x), SMOOTH=smooth, RNE=needs_rne(dw))

    def grad_buffer(v0: int, v1: int, start: int) -> torch.Tensor:
        n = v1 - v0
        return (flat[start: start + bt * n] if start >= 0 else ws[: bt * n]).view(bt, n)

    def logits(v0: int, v1: int, out: torch.Tensor, mode, tile_base: int, store: bool) -> None:
        """Logits of columns [v0, v1): their stats (and, with store, themselves into out) or their gradient."""
        n, w = v1 - v0, weight[v0:v1]
        if gemm.tma and _tma_ready(x, w):
            x_desc = TensorDescriptor.from_tensor(x, [bm, bk])
            w_desc = TensorDescriptor.from_tensor(w, [bn, bk])
            programs = _programs(gemm, dev, triton.cdiv(bt, bm) * triton.cdiv(n, bn))
            _tma_logits_kernel[(programs,)](x_desc, w_desc, target, stats, tgt_logit, lse, row_scale, out,
                                            out.stride(0), bt, n, h, v0, v, tile_base, n_tiles, label_smoothing,
                                            programs, MODE=mode, STORE=store, **common, **_persistent(gemm, config))
            return
        grid = (triton.cdiv(bt, bm) * triton.cdiv(n, bn),)
        _vocab_logits_kernel[grid](x, w, target, stats, tgt_logit, lse, row_scale, out, out.stride(0), bt, n, h, v0,
                                   v, x.stride(0), weight.stride(0), tile_base, n_tiles, label_smoothing, MODE=mode,
                                   STORE=store, EVEN_K=h % bk == 0, SUBTILE=gemm.subtile, **common,
                                   **_tiles(config, gemm.group_m))

    tile_base = 0
    for v0, v1, start in passes:
        store = start >= 0
        logits(v0, v1, grad_buffer(v0, v1, start) if store else dx, MODE_STATS, tile_base, store)
        tile_base += triton.cdiv(v1 - v0, bn)
    _lse_kernel[(triton.cdiv(bt, 128),)](stats, tgt_logit, target, n_valid, lse, row_scale, loss_rows, bt, n_tiles,
                                         v, ignore_index, label_smoothing, SMOOTH=smooth, MEAN=mean, BLOCK=128,
                                         num_warps=4)
    # dx sums one product per chunk; rounded to bf16 after each (11 times at the task's shape) a few of its elements
    # cancelled to values the harness's elementwise bound rejects on outlier inputs (3 of 33.5M): kept in
    # fp32 (128 MiB more) and rounded once.
    hh = h // 2
    if split:  # (accumulator, its columns of dx)
        acc_parts = [(dx.view(-1).view(torch.float32).view(bt, hh), slice(0, hh)),
                     (flat[v_main * h: v_main * h + bt * h].view(torch.float32).view(bt, hh), slice(hh, h))]
    elif tail:
        acc_parts = [(flat[v_main * h: v_main * h + bt * h * 4 // dw.element_size()].view(torch.float32).view(bt, h),
                      slice(0, h))]
    elif dx_fp32 and dx.dtype != torch.float32:
        acc_parts = [(torch.empty(dx.shape, dtype=torch.float32, device=dev), slice(0, h))]
    else:
        acc_parts = [(dx, slice(0, h))]

    def dx_terms(dl: torch.Tensor, c0: int, c1: int, accumulate: bool) -> None:
        for acc, cols in acc_parts:
            matmul(dl, weight[c0:c1, cols], acc, accumulate=accumulate, config=dx_config, gemm=gemm)

    for i, (v0, v1, start) in enumerate(chunks):
        n = v1 - v0
        dl = grad_buffer(v0, v1, start)
        if i < n_stored:
            _logits_to_grad_kernel[(bt, triton.cdiv(n, 4096))](dl, n, target, lse, row_scale, n, v0, v,
                                                               label_smoothing, RNE=needs_rne(dl), BLOCK=4096,
                                                               num_warps=8)
        else:
            logits(v0, v1, dl, MODE_GRAD, 0, False)
        matmul(dl.t(), x, dw[v0:v1], config=dw_config, gemm=gemm)
        dx_terms(dl, v0, v1, i > 0)
    pieces = [(c0, min(c0 + ws_cols, v)) for c0 in range(v_main, v, ws_cols)] if tail else []
    for i, (c0, c1) in enumerate(pieces):  # the tail's dx terms, while the accumulator holds its rows
        dl = grad_buffer(c0, c1, -1)
        logits(c0, c1, dl, MODE_GRAD, 0, False)
        dx_terms(dl, c0, c1, bool(chunks) or i > 0)
    # The last piece's gradient stays in the workspace for its dweight rows, unless a split accumulator needs that
    # room to be rounded into dx.
    keep = bt * (pieces[-1][1] - pieces[-1][0]) if pieces else 0
    if split:
        if (ws.numel() - keep) // 2 < hh:
            keep = 0
        _round_split_dx(dx, acc_parts[0][0], acc_parts[1][0], ws[keep + keep % 2:])
    elif acc_parts[0][0] is not dx:
        dx.copy_(acc_parts[0][0])
    # then the tail's dweight rows, over the accumulator (the kept gradient first, the others recomputed)
    for i, (c0, c1) in enumerate(reversed(pieces)):
        dl = grad_buffer(c0, c1, -1)
        if i or not keep:
            logits(c0, c1, dl, MODE_GRAD, 0, False)
        matmul(dl.t(), x, dw[c0:c1], config=dw_config, gemm=gemm)
    return sum_rows(loss_rows, n_valid, mean), dx, dw


def linear_cross_entropy_fwd_bwd(
    x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
    label_smoothing: float = 0.0, reduction: str = "mean", form: str = "vocab", chunk: int | None = None,
    split_k: int | None = None, logits_config=None, dx_config=None, dw_config=None, fused_ce: bool | None = None,
    workspace: int | None = None, store_chunks: int = 3, gemm: str = "tma", warp_specialize: bool = False,
    flatten: bool | None = None, programs: int = 0, dx_fp32: bool = True, dx_in_dweight: bool = False,
    epilogue_subtile: bool = False, group_m: int = 8, dx_split: bool = False, tma_store: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, dx, dweight) of cross_entropy(x @ weight^T, target) for an upstream gradient of 1.
    form "vocab": logits_config tiles the logits/gradient kernel, workspace (bytes) is the fixed scratch,
    store_chunks (0-3 useful) is how many leading chunks keep pass 1's logits instead of recomputing them; gemm
    "tma" (descriptors, persistent grid of `programs`, 0 = one per SM; warp_specialize and flatten, which
    defaults to not warp_specialize, go to the tile loop) or "ptr" (pointer loads, one program a tile).
    form "token": chunk (tokens), split_k of dx, fused_ce; its products take the pointer path.
    dx_config / dw_config tile the two backward products in both forms; configs are (BM, BN, BK, warps, stages).
    dx_fp32 (vocab form): accumulate dx over the chunks in fp32 and round once (False: in dx's dtype, 128 MiB less
    at the task's shape, rounded once per chunk). dx_in_dweight (vocab form, dx_fp32, x not fp32): that fp32 sum in
    the storage of dweight's last rows (dx_tail_rows: 2 BT of them for bf16), written last, instead of 128 MiB more
    at the task's shape; those rows' gradient is recomputed once more (2 BT H x 2 BT FLOPs: 1.1 TFLOP there) but
    for the last workspace piece's, still in the workspace (0.9 TFLOP with 3072-column pieces). dx_split (with
    dx_in_dweight, a 2-byte dtype, H even): the accumulator's first H/2 columns in dx's own storage and only the
    rest in dweight's last BT rows, so half as many rows are recomputed (0.55 TFLOP less at the task's shape; each
    dx product then two launches of H/2 columns). epilogue_subtile (Gemm.subtile), group_m (the grouped tile
    order) and tma_store (Gemm.tma_store) are GEMM options of the vocab form; subtile's own default tiles are
    _default_config's. H200 (sweep_lce.py, do_bench): 49.06 ms at 1.213 GiB with none of them, 52.19 with
    dx_in_dweight, 47.41 with subtile + dx_in_dweight + dx_split and 3-stage logits/dW tiles (GPU_DEFAULT, 1.088
    GiB). On top of GPU_DEFAULT (sweep_lce.py --rest): 48.685 ms; with warp specialisation and tma_store
    47.901 (one run, not adopted); warp specialisation with 4 dx stages 48.702; group_m 16 48.774."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy: expected x [BT, H] and weight [V, H], got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if target.shape != (x.shape[0],) or target.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"linear_cross_entropy: expected an integer target of shape [{x.shape[0]}], got "
                         f"{tuple(target.shape)} {target.dtype}")
    if x.dtype != weight.dtype or not x.is_floating_point():
        raise ValueError(f"linear_cross_entropy: x and weight must share one float dtype, got {x.dtype} and "
                         f"{weight.dtype}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"linear_cross_entropy: reduction must be 'mean' or 'sum', got {reduction!r}")
    if form not in ("vocab", "token"):
        raise ValueError(f"linear_cross_entropy: form must be 'vocab' or 'token', got {form!r}")
    if gemm not in ("tma", "ptr"):
        raise ValueError(f"linear_cross_entropy: gemm must be 'tma' or 'ptr', got {gemm!r}")
    if group_m < 1:
        raise ValueError(f"linear_cross_entropy: group_m must be >= 1, got {group_m}")
    if store_chunks < 0 or programs < 0:
        raise ValueError(f"linear_cross_entropy: store_chunks and programs must be >= 0, got {store_chunks} and "
                         f"{programs}")
    x, weight, target = x.contiguous(), weight.contiguous(), target.contiguous()
    mean = reduction == "mean"
    if form == "token":
        return _token_form(x, weight, target, ignore_index, label_smoothing, mean, chunk, split_k, logits_config,
                           dx_config, dw_config, fused_ce)
    engine = Gemm(tma=gemm == "tma", warp_specialize=warp_specialize,
                  flatten=not warp_specialize if flatten is None else flatten, programs=programs,
                  subtile=epilogue_subtile, group_m=group_m, tma_store=tma_store)
    return _vocab_form(x, weight, target, ignore_index, label_smoothing, mean, logits_config, dx_config, dw_config,
                       workspace, store_chunks, engine, dx_fp32, dx_in_dweight, dx_split)


# The task's options on a GPU (H200, benchmarks/sweep_lce.py, do_bench): epilogues by column
# halves with 3-stage 128x256x64 tiles for the logits and dweight products, and the fp32 dx sum half in dx's own
# storage, half in dweight's last BT rows (dx_in_dweight + dx_split): 47.41 ms at 1.088 GiB extra, against 49.06 ms
# at 1.213 GiB without them (eager 48.12 ms at 13.7 GiB, Liger 54.64 ms at 1.102 GiB in the same run).
GPU_DEFAULT = dict(epilogue_subtile=True, dx_in_dweight=True, dx_split=True, logits_config=(128, 256, 64, 8, 3),
                   dw_config=(128, 256, 64, 8, 3))


class ModelNew(torch.nn.Module):
    """tasks/linear_cross_entropy.py: (loss, dx, dweight) of an LM head's cross-entropy."""

    def __init__(self, hidden: int, vocab: int, ignore_index: int = -100, label_smoothing: float = 0.0,
                 reduction: str = "mean"):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(vocab, hidden, dtype=torch.bfloat16))
        self.ignore_index, self.label_smoothing, self.reduction = ignore_index, label_smoothing, reduction

    def forward(self, x: torch.Tensor, target: torch.Tensor):
        gpu = GPU_DEFAULT if x.is_cuda else {}
        return linear_cross_entropy_fwd_bwd(x, self.weight.detach(), target, self.ignore_index,
                                            self.label_smoothing, self.reduction, **gpu)
