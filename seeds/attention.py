"""Attention in the FlashAttention-2 style: forward and backward, causal or not, GQA/MQA, packed variable-length
sequences, never materialising the S x S score matrix.

Shapes: q [B, Hq, Sq, D]; k, v [B, Hkv, Sk, D] with Hq a multiple of Hkv (GQA; Hkv = 1 is MQA); D a power of two
from 16 to 256 (64 and 128 are the targets); fp16/bf16 (fp32 works, through full-precision dots); any strides with
a unit stride along D. Variable-length packed sequences: q [Tq, Hq, D], k/v [Tk, Hkv, D] and int32 cu_seqlens
[batch + 1] (the FlashAttention convention), forward and backward. Causal masks are top-left aligned (key j is seen
by query i when j <= i), as SDPA's is_causal; for Sq == Sk that is the usual mask.

Forward, per (query block of BLOCK_M rows, batch, query head): stream the key/value blocks of BLOCK_N rows and keep
the online softmax in base 2 (exp2 with log2(e) folded into the scale):
    s = (q k^T) * scale * log2(e),  m' = max(m, rowmax s),  p = exp2(s - m'),
    l' = l exp2(m - m') + rowsum p,  acc' = acc exp2(m - m') + p v,
    o = acc / l,  lse2 = m + log2 l    ([B, Hq, Sq] fp32: the log-sum-exp of the scaled scores in base 2, that is
                                        log2(e) times the natural one; kept in base 2 so that the backward's
                                        p = exp2(s - lse2) is exactly 1 where a row's softmax is one-hot)
The key loop is split in two: blocks wholly inside the sequence and below the diagonal run without masks; the
diagonal blocks (causal) and the partial last block run with them. In the unmasked blocks the row max is taken
before scaling (max(s) c = max(s c) for c > 0), so scaling and subtracting the max is one FMA per score, as in
Triton's fused-attention tutorial.
FLOPs: 4 B Hq Sq Sk D (half of it when causal); at B4 H32 S4096 D128 that is 1.10 TFLOP.

Backward (the FA2 algorithm; see _attn_bwd_dkdv_kernel for the maths): a preprocess kernel computes
delta = rowsum(dO o O); one kernel per key block accumulates dK and dV over all query blocks of every query head
of its group (GQA reduced in registers, no atomics: bitwise repeatable); one kernel per query block accumulates dQ
over the key blocks. P is recomputed from q, k and the saved lse in both, so the backward does 2.5x the forward's
matmul FLOPs (5 matmuls against 2; 3.5x the forward for forward + backward together).

Every tl.dot takes the input dtype (bf16/fp16) with fp32 accumulation on the GPU. On the CPU interpreter (Triton
3.9), whose bf16 tl.dot is wrong and whose fp32 -> bf16 conversion truncates, the operands are upcast to fp32
(UPCAST: bf16/fp16 products are exact in fp32) and bf16 outputs rounded to nearest before the store (RNE).
P and dS enter their dots in the input dtype on the GPU (the tensor cores' input, as in FlashAttention) but stay
fp32 on the interpreter: the CPU check covers the algorithm, not that rounding. Emulated exactly on the CPU, the
rounding put 1 element of dQ in ~10^5 outside the harness's elementwise tolerance on the "outliers" inputs, against
SDPA's CPU backward whose P and dS stay fp32; on the GPU the reference (SDPA's flash/cuDNN backends) rounds them too.
Hopper (launcher keyword `tma`, on by default on sm_90+): the K/V tiles of the forward's and the dQ kernel's
unmasked key loops, and the Q/dO tiles of the dK/dV kernel's unmasked query loop, come through host TMA descriptors
(TensorDescriptor over the tensor seen as one [rows, D] matrix: row b*RB + h*RH + s). Only unmasked blocks use them
(every such block lies wholly inside its sequence, so a tile never reads another head's rows); the masked diagonal
and tail blocks, the Q tile and the stores keep pointers. Layouts a descriptor cannot read (packed varlen
sequences, a row stride or base not 16-byte aligned, batch/head strides that are not whole rows) keep the pointer
path whatever `tma` says. Causal launches run the query blocks last-first (`reverse`), so the longest programs start
first and the short ones fill the tail.

Forward variants (launcher keywords, off by default; benchmarks/sweep_attention_fwd.py times them), after Triton's
fused-attention tutorial (python/tutorials/06-fused-attention.py, 3.4-3.6), FlashAttention-3 and -4:
- warp_specialize: the tutorial's Hopper structure. Triton's Hopper warp-specialisation pass (3.6 and 3.9, checked by
  compiling for sm_90 on the CPU) applies only at 4 warps, where it turns the program into 12 warps: a producer warp
  group issuing TMA loads and two consumer warp groups of BLOCK_M / 2 rows (setmaxnreg 40 / 232), FA3's layout. It
  fails (assertions in the pass) on an early return, on any pointer load in the kernel (Q's included) and on a
  second key loop, and in 3.9 on a host descriptor for Q (whose block it splits in two); an scf.if in the loop makes
  it silently give up. So this path makes Q/K/V descriptors in the kernel (tl.make_tensor_descriptor, as the tutorial does on
  Hopper), runs ONE key loop with the causal mask applied in every block (a select per score), and is taken only
  where the keys fill whole blocks (else the two-loop path runs); 128 x 128 tiles fit 2 stages (180 KB; 3 would
  need 246 KB). At 8 warps the pass does not apply (the old variant measured no change).
- subtiles=2: two query sub-tiles of BLOCK_M / 2 rows per program share each K/V tile, the second's QK^T issued
  before the first's softmax, so the asynchronous wgmma of one may overlap the other's exp2 (FA3's intra-warp-group
  overlap, without its named barriers, which Triton does not expose).
- persistent: about `persistent` programs per SM loop over the (query block, head) tiles; causal, the longest first.
- defer_rescale: the running max moves only when some row's grows by more than 8 (base 2), and the rescale of the
  accumulator is skipped until then (FA4); the decision is one max over the tile's rows (a cross-warp reduction per
  block on Hopper, where the rescale is 64 FMULs a thread), so it may cost more than it saves.
- overlap (with warp_specialize): the warp-specialised loop rotated so that step j issues S_j = q K_j^T before
  the previous block's P V, then takes S_j's softmax (FA3's intra-warp-group overlap); one step more than blocks
  (P = 0 in the first, S dropped in the last). Compiled for sm_90 with triton 3.9 the consumers' wgmma are still
  waited one by one (wait_group 0); on the H200 it gained nothing: 536.1 TFLOP/s persistent against
  554.6, causal 413.7.
- pairs (with persistent, causal): programs run whole pairs of a head's query blocks NUM_M - 1 - j and j (the same
  work per pair), head by head, so that the programs running at once share a few heads' K/V in L2 (do_bench:
  525.5 TFLOP/s causal against 450.1 not persistent and 406.7 persistent longest first; the causal default; the
  longest-first persistent order spreads them over every head).
Tried and dropped (compiled for sm_90, triton 3.9): the causal diagonal blocks outside the warp-specialised loop
(unrolled before or after it) and the rotated loop with P carried in bf16 abort Triton's Hopper pass; BLOCK_M 256
warp-specialised (FA3's two 128-row consumer tiles) spills 480 bytes under the pass's 232-register consumers.
Already in the default: exp2 with the scale folded into one FMA per score (SCALE_POS) and the causal mask only on
the diagonal blocks (the two-loop split). Not ported: FA3's ping-pong between two warp groups (named barriers) and
the tutorial's Blackwell-only pieces (maxnreg 168/80 with warp specialisation, accumulator sub-tiling, f32x2 FMAs).

Backward variants (attention_bwd keywords, off by default; benchmarks/sweep_attention_bwd.py checks them against the
harness's bound and times them: dq_atomic 0.43x, split_ds="fp16" 5% faster non-causal, slower causal): dq_atomic, FlashAttention-2's layout: the dK/dV kernel also
adds each step's c dS K into an fp32 dQ (red.global.add, not bitwise repeatable) and the dQ kernel, which recomputes
S and dP, is not launched; split_ds="fp16": dS in one fp16 product (3 more bits than bf16) instead of the split's
two. Not done: tl.range(warp_specialize=True) in the backward's loops, on which Triton's Hopper pass asserts as the
kernels stand (pointer loads of lse and delta, three loops; compiled for sm_90 with triton 3.9).
Backward schedules (attention_bwd's schedule, both main kernels; _bwd_tile; benchmarks/sweep_attention_bwd.py
--schedules): "grid" (the default), "heavy_first" (a causal dQ launch's longest query blocks first),
"blocks_major" (the grid's axes swapped), "persistent" (one program per SM over the tiles head by head) and "pairs"
(causal: persistent over a heavy and a light block of one head at a time, as the forward's pairs). Each runs the
same tile code, so the gradients are bitwise the grid's. Compiled for sm_90 (triton 3.9), the persistent dK/dV
kernel spills 284-340 bytes the grid's does not (255 registers either way). config may carry the dQ kernel's own
warps and stages (8 entries).

Tile sizes: see fwd_config / bwd_config; benchmarks/bench_attention.py --hopper sweeps the variants on the H200.
Measured on the H200 (do_bench, one run), B4 H32 S4096 D128 bf16, the defaults:
forward 498 TFLOP/s (causal 431): 1.42x SDPA's flash backend (351; causal 319), 0.82x cuDNN (607; causal 0.82x of
528). The 600 / 525 targets are not met: Triton 3.6's Hopper code for this loop (TMA loads, no warp-specialised
producer/consumer split, which it does not apply at 8 warps) stays ~18% behind cuDNN's hand-scheduled kernel.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from seeds._common import sm_count
from seeds.attention_gluon import attention_fwd_gluon
from seeds.cross_entropy import round_bf16_rne, store_rounded

CRUCIBLE_SEED = {
    "name": "attention",
    "tasks": ["attention_fwd.py", "attention_fwd_causal.py"],
    "ops": ["attention fwd (FlashAttention-2, causal or not, GQA, varlen)"],
}



# ---- shared device functions -----------------------------------------------------------------------------------
@triton.jit
def _mm(a, b, acc, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """acc + a @ b with fp32 accumulation (see the module docstring for UPCAST)."""
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif IEEE:
        out = tl.dot(a, b, acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


@triton.jit
def _seq_bounds(CU_Q, CU_K, b, S_Q, S_K, VARLEN: tl.constexpr):
    """(first row, length) of sequence b's queries and keys: packed through cu_seqlens, or the dense lengths."""
    if VARLEN:
        q_start = tl.load(CU_Q + b)
        q_len = tl.load(CU_Q + b + 1) - q_start
        k_start = tl.load(CU_K + b)
        k_len = tl.load(CU_K + b + 1) - k_start
    else:  # tensors, not constexprs (S_Q == 1 arrives as a constexpr), so that callers may .to() them
        q_start = b * 0
        q_len = b * 0 + S_Q
        k_start = b * 0
        k_len = b * 0 + S_K
    return q_start, q_len, k_start, k_len


@triton.jit
def _key_bounds(start_m, k_len, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(bulk_hi, hi) of query block start_m's key loop: keys [0, bulk_hi) in whole blocks needing no mask (wholly
    inside the keys and, when causal, wholly left of the block's first row), then [bulk_hi, hi) masked."""
    full_k = (k_len // BLOCK_N) * BLOCK_N
    if CAUSAL:
        bulk_hi = tl.minimum((start_m * BLOCK_M // BLOCK_N) * BLOCK_N, full_k)
        hi = tl.minimum(k_len, (start_m + 1) * BLOCK_M)
    else:
        bulk_hi = full_k
        hi = k_len
    return bulk_hi, hi


@triton.jit
def _operand(x, dtype: tl.constexpr, UPCAST: tl.constexpr):
    """fp32 P or dS as a tl.dot operand: `dtype` on the GPU (the tensor cores' input, as in FlashAttention and
    SDPA's GPU backends); left in fp32 on the interpreter, whose dots run in fp32 anyway (see the docstring)."""
    if not UPCAST:
        x = x.to(dtype)
    return x


@triton.jit
def _ds_product(ds, b, acc, SPLIT_DS: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """acc + dS b, the dK and dQ products. dS (fp32) enters as one operand rounded to b's dtype (SPLIT_DS 0), or
    with SPLIT_DS 1 (the `precise` backward) as two, hi = dS rounded and lo = the rest rounded, which keeps about
    twice the bits; SPLIT_DS 2: one fp16 product, dS rounded to fp16 (11 significant bits against bf16's 8, one
    product instead of two) and b converted to fp16 (exact for bf16 values in fp16's normal range; b's range and
    dS's must fit fp16's, +-65504). On the interpreter hi (and the fp16 rounding) is the GPU's rounding emulated
    and lo the exact rest, both left in fp32."""
    if not SPLIT_DS:
        return _mm(_operand(ds, b.dtype, UPCAST), b, acc, UPCAST, IEEE)
    if SPLIT_DS == 2:
        if UPCAST:
            return _mm(ds.to(tl.float16).to(tl.float32), b.to(tl.float16).to(tl.float32), acc, UPCAST, IEEE)
        return _mm(ds.to(tl.float16), b.to(tl.float16), acc, UPCAST, IEEE)
    if UPCAST:
        hi = round_bf16_rne(ds)
        lo = ds - hi
    else:
        hi = ds.to(b.dtype)
        lo = (ds - hi.to(tl.float32)).to(b.dtype)
    return _mm(lo, b, _mm(hi, b, acc, UPCAST, IEEE), UPCAST, IEEE)


@triton.jit
def _tile_pair(a_ptrs, b_ptrs, A_DESC, B_DESC, a_row, b_row, ok, MASK: tl.constexpr, TMA: tl.constexpr):
    """Two [rows, D] tiles of the same rows (q and dO, or k and v): masked pointer loads (MASK; ok: the valid rows,
    the others read as 0), descriptor loads at rows a_row / b_row of the [rows, D] views (TMA), or plain loads."""
    if MASK:
        a = tl.load(a_ptrs, mask=ok[:, None], other=0.0)
        b = tl.load(b_ptrs, mask=ok[:, None], other=0.0)
    elif TMA:
        a = A_DESC.load([a_row, 0])
        b = B_DESC.load([b_row, 0])
    else:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
    return a, b


# ---- forward ------------------------------------------------------------------------------------------------------
@triton.jit
def _fwd_inner(acc, l_i, m_i, dsum, q, acc1, l1, m1, q1, do, k_base, v_base, stride_ks, stride_vs, K_DESC, V_DESC,
               k_row, v_row, rows, rows1, lo, hi, k_len, qk_scale, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
               MASK: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr,
               SCALE_POS: tl.constexpr, PRECISE: tl.constexpr, SUBTILES: tl.constexpr, DIAG: tl.constexpr,
               DEFER: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, RNE: tl.constexpr):
    # Key blocks [lo, hi) of one sequence; MASK applies the key bound and the causal mask. TMA (unmasked ranges
    # only, where every block lies wholly inside the sequence): K and V tiles come through tensor descriptors over
    # the [rows, D] view, at rows k_row + start_n and v_row + start_n; else through pointer tiles.
    # SUBTILES = 2: a second query sub-tile (q1, rows1; acc1, l1, m1) shares each K/V tile; with 1 those arguments
    # pass through untouched. DIAG: the causal mask inside an unmasked range (the single-loop structure of the
    # warp-specialised path). DEFER: see _online_softmax.
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    # Pointers advance by BLOCK_N rows a step (64-bit pointers, 32-bit increments: no overflow on long caches).
    k_ptrs = k_base + tl.cast(lo, tl.int64) * stride_ks + offs_n[:, None] * stride_ks + offs_d[None, :]
    v_ptrs = v_base + tl.cast(lo, tl.int64) * stride_vs + offs_n[:, None] * stride_vs + offs_d[None, :]
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        cols = start_n + offs_n
        kv_ok = cols < k_len
        if MASK:
            k = tl.load(k_ptrs, mask=kv_ok[:, None], other=0.0)
        elif TMA:
            k = K_DESC.load([k_row + start_n, 0])
        else:
            k = tl.load(k_ptrs)
        s = _mm(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), UPCAST, IEEE)
        if SUBTILES == 2:  # issued before the first sub-tile's softmax, so the two can overlap
            s1 = _mm(q1, tl.trans(k), tl.zeros([q1.shape[0], BLOCK_N], dtype=tl.float32), UPCAST, IEEE)
        p, m_new, alpha, moved = _online_softmax(s, m_i, cols, kv_ok, rows, qk_scale, MASK, CAUSAL, SCALE_POS, DIAG,
                                                  DEFER)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if SUBTILES == 2:
            p1, m1_new, alpha1, moved1 = _online_softmax(s1, m1, cols, kv_ok, rows1, qk_scale, MASK, CAUSAL,
                                                          SCALE_POS, DIAG, DEFER)
            l1 = l1 * alpha1 + tl.sum(p1, axis=1)
        if MASK:
            v = tl.load(v_ptrs, mask=kv_ok[:, None], other=0.0)
        elif TMA:
            v = V_DESC.load([v_row + start_n, 0])
        else:
            v = tl.load(v_ptrs)
        if DEFER:
            if moved:  # some row's max moved: rescale the accumulator (skipped while every row's stays put)
                acc = acc * alpha[:, None]
            acc = _mm(_operand(p, v.dtype, UPCAST), v, acc, UPCAST, IEEE)
        else:
            acc = _mm(_operand(p, v.dtype, UPCAST), v, acc * alpha[:, None], UPCAST, IEEE)
        if SUBTILES == 2:
            if DEFER:
                if moved1:
                    acc1 = acc1 * alpha1[:, None]
                acc1 = _mm(_operand(p1, v.dtype, UPCAST), v, acc1, UPCAST, IEEE)
            else:
                acc1 = _mm(_operand(p1, v.dtype, UPCAST), v, acc1 * alpha1[:, None], UPCAST, IEEE)
            m1 = m1_new
        if PRECISE:
            # delta = sum_j P_ij dP_ij with the unrounded P the backward recomputes: the dS of a row then sum to
            # zero as the softmax Jacobian's do (delta = rowsum(dO o O) inherits the error of P rounded for P V).
            dp = _mm(do, tl.trans(v), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), UPCAST, IEEE)
            dsum = dsum * alpha + tl.sum(p * dp, axis=1)
        m_i = m_new
        if MASK or not TMA:
            k_ptrs += BLOCK_N * stride_ks
            v_ptrs += BLOCK_N * stride_vs
    return acc, l_i, m_i, dsum, acc1, l1, m1


@triton.jit
def _fwd_inner_overlap(acc, l_i, m_i, q, K_DESC, V_DESC, k_row, v_row, rows, hi, qk_scale, BLOCK_N: tl.constexpr,
                       CAUSAL: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    # The warp-specialised key loop rotated for FlashAttention-3's intra-warp-group overlap: step j issues
    # S_j = q K_j^T, then the previous block's acc * alpha + P_{j-1} V_{j-1}, and only then takes S_j's softmax,
    # which may run while the tensor cores do P_{j-1} V_{j-1} (in the plain loop the softmax waits for S_j and the
    # P V product for the softmax: nothing overlaps within a consumer warp group). hi / BLOCK_N + 1 steps: step 0
    # multiplies P = 0 (nothing) into V_0; the last step's S (K clamped to the last block) is dropped (the max and
    # the sum stay), so the loop costs one block's QK^T and P V more than the blocks it covers. A single loop with
    # no product outside it: Triton's Hopper pass rejects a dot outside the loop (checked compiling for sm_90).
    # The launcher checks qk_scale > 0 (the max is taken before scaling) and that the keys fill whole blocks.
    n = hi // BLOCK_N
    offs_n = tl.arange(0, BLOCK_N)
    p = tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32)  # carried in fp32: the pass asserts on a bf16 one
    alpha = tl.full([q.shape[0]], 1.0, dtype=tl.float32)
    for j in tl.range(0, n + 1, warp_specialize=True):
        start_n = tl.minimum(j, n - 1) * BLOCK_N
        k = K_DESC.load([k_row + start_n, 0])
        s = _mm(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), UPCAST, IEEE)
        v = V_DESC.load([v_row + tl.maximum(j - 1, 0) * BLOCK_N, 0])
        acc = _mm(_operand(p, v.dtype, UPCAST), v, acc * alpha[:, None], UPCAST, IEEE)
        if CAUSAL:  # qk_scale > 0: -inf stays -inf through the FMA below
            s = tl.where(start_n + offs_n[None, :] <= rows[:, None], s, float("-inf"))
        live = j < n
        m_new = tl.where(live, tl.maximum(m_i, tl.max(s, axis=1) * qk_scale), m_i)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = tl.where(live, l_i * alpha + tl.sum(p, axis=1), l_i)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _online_softmax(s, m_i, cols, kv_ok, rows, qk_scale, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                    SCALE_POS: tl.constexpr, DIAG: tl.constexpr, DEFER: tl.constexpr):
    """(p, the new running max, alpha = exp2(old max - new), whether any row's max moved) for one block of raw
    scores s [rows, BLOCK_N]. DEFER (the FlashAttention-4 trick): the running max only moves when some row's grows
    by more than 8 (base 2); until then p is taken against the stale max (p <= 2^8, exact in fp32 and as a bf16
    operand), alpha is 1 and the accumulator's rescale is skipped. The result is the same softmax: l and acc are
    both kept against whichever max was used, and o = acc / l, lse = m + log2 l."""
    if MASK:
        s = s * qk_scale
        ok = kv_ok[None, :]
        if CAUSAL:
            ok = ok & (cols[None, :] <= rows[:, None])
        s = tl.where(ok, s, float("-inf"))
        # Every row meets a valid key in the first block it processes (see _attn_fwd_kernel): m_new is finite.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        moved = m_new  # (read only with DEFER)
    elif SCALE_POS:
        if DIAG:  # qk_scale > 0: -inf stays -inf through the FMA below
            s = tl.where(cols[None, :] <= rows[:, None], s, float("-inf"))
        # max(s) * c == max(s * c) for c > 0, so the scale folds into one FMA per score: s * c - m.
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        moved = m_new
        if DEFER:
            moved = tl.max(m_new - m_i, axis=0) > 8.0
            m_new = tl.where(moved, m_new, m_i)
        p = tl.exp2(s * qk_scale - m_new[:, None])
    else:
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        moved = m_new
    return p, m_new, tl.exp2(m_i - m_new), moved


@triton.jit
def _fwd_epilogue(acc, l_i, m_i, dsum, rows, q_len, q_start, b64, hq64, O, LSE, DO, DELTA, stride_ob, stride_oh,
                  stride_os, stride_dob, stride_doh, stride_dos, stride_lb, stride_lh, HEAD_DIM: tl.constexpr,
                  STORE_LSE: tl.constexpr, WITH_DELTA: tl.constexpr, PRECISE: tl.constexpr, RNE: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = rows < q_len
    q_rows = (q_start + rows).to(tl.int64)
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # a query with no key at all (an empty packed key sequence): o = 0
    o = acc / l_safe[:, None]
    o_ptrs = O + b64 * stride_ob + hq64 * stride_oh + q_rows[:, None] * stride_os + offs_d[None, :]
    store_rounded(o_ptrs, o, row_ok[:, None], RNE)
    l_off = b64 * stride_lb + hq64 * stride_lh + q_start + rows
    if STORE_LSE:
        tl.store(LSE + l_off, m_i + tl.log2(l_safe), mask=row_ok)
    if PRECISE:
        tl.store(DELTA + l_off, dsum / l_safe, mask=row_ok)
    elif WITH_DELTA:
        # The backward's delta from the fp32 o, before its rounding to bf16: the rounding error of a stored O
        # would enter every dS of the row (dS = P o (dP - delta)) and bias dQ and dK.
        do = tl.load(DO + b64 * stride_dob + hq64 * stride_doh + q_rows[:, None] * stride_dos + offs_d[None, :],
                     mask=row_ok[:, None], other=0.0)
        tl.store(DELTA + l_off, tl.sum(o * do.to(tl.float32), axis=1), mask=row_ok)


@triton.jit
def _fwd_tile(
    start_m, bh, Q, K, V, O, LSE, DO, DELTA, CU_Q, CU_K, K_DESC, V_DESC, K_RB, K_RH, V_RB, V_RH, Q_RB, Q_RH, Q_ROWS,
    K_ROWS, V_ROWS, qk_scale, stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh,
    stride_vs, stride_ob, stride_oh, stride_os, stride_dob, stride_doh, stride_dos, stride_lb, stride_lh, S_Q, S_K,
    HQ, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, STORE_LSE: tl.constexpr, WITH_DELTA: tl.constexpr,
    PRECISE: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr, SCALE_POS: tl.constexpr, SUBTILES: tl.constexpr,
    DEFER: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, RNE: tl.constexpr,
):
    # Query block start_m of (batch, query head) bh; the arguments are _attn_fwd_kernel's.
    b = bh // HQ
    hq = bh % HQ
    hkv = hq // GROUP
    q_start, q_len, k_start, k_len = _seq_bounds(CU_Q, CU_K, b, S_Q, S_K, VARLEN)
    if VARLEN or not WS:  # (dense grids fit exactly; Hopper's warp-specialisation pass takes no early exit)
        if start_m * BLOCK_M >= q_len:  # the grid covers the longest packed sequence
            return
    b64 = b.to(tl.int64)
    hq64 = hq.to(tl.int64)
    k_row = b * K_RB + hkv * K_RH + k_start  # int32: the launcher checks the view has fewer than 2^31 rows
    v_row = b * V_RB + hkv * V_RH + k_start
    offs_d = tl.arange(0, HEAD_DIM)
    SUB_M: tl.constexpr = BLOCK_M // SUBTILES
    rows = start_m * BLOCK_M + tl.arange(0, SUB_M)
    rows1 = rows + (SUBTILES - 1) * SUB_M  # the second sub-tile's rows (SUBTILES = 2)
    q_base = Q + b64 * stride_qb + hq64 * stride_qh
    if WS:
        # The warp-specialised loop (Triton's Hopper pass: one producer warp group issuing TMA loads, two consumer
        # warp groups of BLOCK_M / 2 rows each) takes only descriptor loads in the kernel, made on the device so the
        # compiler may split their blocks: Q's too, and one key loop with the causal mask inside (DIAG).
        q_desc = tl.make_tensor_descriptor(Q, [Q_ROWS, HEAD_DIM], [stride_qs, 1], [SUB_M, HEAD_DIM])
        K_DESC = tl.make_tensor_descriptor(K, [K_ROWS, HEAD_DIM], [stride_ks, 1], [BLOCK_N, HEAD_DIM])
        V_DESC = tl.make_tensor_descriptor(V, [V_ROWS, HEAD_DIM], [stride_vs, 1], [BLOCK_N, HEAD_DIM])
        q = q_desc.load([b * Q_RB + hq * Q_RH + q_start + start_m * BLOCK_M, 0])
    else:
        q = tl.load(q_base + (q_start + rows).to(tl.int64)[:, None] * stride_qs + offs_d[None, :],
                    mask=(rows < q_len)[:, None], other=0.0)
    q1 = q
    if SUBTILES == 2:
        q1 = tl.load(q_base + (q_start + rows1).to(tl.int64)[:, None] * stride_qs + offs_d[None, :],
                     mask=(rows1 < q_len)[:, None], other=0.0)
    k_base = K + b64 * stride_kb + hkv.to(tl.int64) * stride_kh + k_start.to(tl.int64) * stride_ks
    v_base = V + b64 * stride_vb + hkv.to(tl.int64) * stride_vh + k_start.to(tl.int64) * stride_vs

    m_i = tl.full([SUB_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([SUB_M], dtype=tl.float32)
    acc = tl.zeros([SUB_M, HEAD_DIM], dtype=tl.float32)
    m1, l1, acc1 = m_i, l_i, acc
    dsum = tl.zeros([SUB_M], dtype=tl.float32)
    if PRECISE and WS:  # dO through a descriptor as Q (the pass takes no pointer load); the launcher checks that
        # dO's [rows, D] view is Q's (same rows per batch and head), so Q's row coordinates address it
        do_desc = tl.make_tensor_descriptor(DO, [Q_ROWS, HEAD_DIM], [stride_dos, 1], [SUB_M, HEAD_DIM])
        do_in = do_desc.load([b * Q_RB + hq * Q_RH + q_start + start_m * BLOCK_M, 0])
    elif PRECISE:
        do_in = tl.load(DO + b64 * stride_dob + hq64 * stride_doh + (q_start + rows).to(tl.int64)[:, None] * stride_dos
                        + offs_d[None, :], mask=(rows < q_len)[:, None], other=0.0)
    else:
        do_in = q  # not read
    if WS:
        # One loop over every key block the query block sees (the launcher checks that the keys fill whole
        # blocks and, causal, that BLOCK_N divides BLOCK_M).
        if CAUSAL:
            hi = tl.minimum(k_len, (start_m + 1) * BLOCK_M)
        else:
            hi = k_len
    if WS == 2:
        acc, l_i, m_i = _fwd_inner_overlap(acc, l_i, m_i, q, K_DESC, V_DESC, k_row, v_row, rows, hi, qk_scale,
                                           BLOCK_N, CAUSAL, UPCAST, IEEE)
    elif WS:
        acc, l_i, m_i, dsum, acc1, l1, m1 = _fwd_inner(
            acc, l_i, m_i, dsum, q, acc1, l1, m1, q1, do_in, k_base, v_base, stride_ks, stride_vs, K_DESC, V_DESC,
            k_row, v_row, rows, rows1, 0, hi, k_len, qk_scale, BLOCK_N, HEAD_DIM, False, CAUSAL, True, True,
            SCALE_POS, PRECISE, SUBTILES, CAUSAL, DEFER, UPCAST, IEEE, RNE)
    else:
        # Unmasked blocks: wholly inside the keys and, when causal, wholly left of this block's first row. The
        # masked range then starts at a key every row of the block may see (j = its first key <= every row i), so
        # no row is left with only -inf scores after its first block.
        bulk_hi, hi = _key_bounds(start_m, k_len, BLOCK_M, BLOCK_N, CAUSAL)
        acc, l_i, m_i, dsum, acc1, l1, m1 = _fwd_inner(
            acc, l_i, m_i, dsum, q, acc1, l1, m1, q1, do_in, k_base, v_base, stride_ks, stride_vs, K_DESC, V_DESC,
            k_row, v_row, rows, rows1, 0, bulk_hi, k_len, qk_scale, BLOCK_N, HEAD_DIM, False, CAUSAL, TMA, False,
            SCALE_POS, PRECISE, SUBTILES, False, DEFER, UPCAST, IEEE, RNE)
        acc, l_i, m_i, dsum, acc1, l1, m1 = _fwd_inner(
            acc, l_i, m_i, dsum, q, acc1, l1, m1, q1, do_in, k_base, v_base, stride_ks, stride_vs, K_DESC, V_DESC,
            k_row, v_row, rows, rows1, bulk_hi, hi, k_len, qk_scale, BLOCK_N, HEAD_DIM, True, CAUSAL, False, False,
            SCALE_POS, PRECISE, SUBTILES, False, False, UPCAST, IEEE, RNE)
    _fwd_epilogue(acc, l_i, m_i, dsum, rows, q_len, q_start, b64, hq64, O, LSE, DO, DELTA, stride_ob, stride_oh,
                  stride_os, stride_dob, stride_doh, stride_dos, stride_lb, stride_lh, HEAD_DIM, STORE_LSE,
                  WITH_DELTA, PRECISE, RNE)
    if SUBTILES == 2:
        _fwd_epilogue(acc1, l1, m1, dsum, rows1, q_len, q_start, b64, hq64, O, LSE, DO, DELTA, stride_ob,
                      stride_oh, stride_os, stride_dob, stride_doh, stride_dos, stride_lb, stride_lh, HEAD_DIM,
                      STORE_LSE, WITH_DELTA, PRECISE, RNE)


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, O, LSE,
    DO, DELTA,   # WITH_DELTA only: an upstream gradient known at forward time, and delta = rowsum(dO o O) out
    CU_Q, CU_K,  # [batch + 1] int32 sequence starts (VARLEN only; any pointer otherwise)
    K_DESC, V_DESC,  # TMA only: host tensor descriptors over K and V seen as [rows, D] (block [BLOCK_N, D])
    K_RB, K_RH, V_RB, V_RH,  # TMA only: rows of that view per batch and per head (row of key j: b*RB + h*RH + j)
    Q_RB, Q_RH,  # WS only: the same for Q (its descriptor is made in the kernel, as those over K and V then)
    Q_ROWS, K_ROWS, V_ROWS,  # WS only: rows of the three [rows, D] views
    qk_scale,    # softmax scale * log2(e)
    stride_qb, stride_qh, stride_qs,  # elements; D has unit stride. Packed sequences: stride_*b = 0
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os,
    stride_dob, stride_doh, stride_dos,
    stride_lb, stride_lh,             # LSE (and DELTA) [B, Hq, Sq] (packed: [Hq, Tq], stride_lb = 0); rows unit stride
    S_Q, S_K,                         # dense lengths (VARLEN: unused, the grid covers the longest sequence)
    HQ,                               # query heads
    NUM_M, NUM_BH,                    # PERSISTENT only: query blocks per (batch, head), and batch * HQ
    GROUP: tl.constexpr,              # query heads per key/value head
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, STORE_LSE: tl.constexpr, WITH_DELTA: tl.constexpr,
    PRECISE: tl.constexpr,    # WITH_DELTA only: delta = sum_j P_ij dP_ij (one more product a key block)
    TMA: tl.constexpr,        # K/V tiles of the unmasked key blocks through K_DESC/V_DESC (the Hopper TMA unit)
    WS: tl.constexpr,         # the warp-specialised single key loop over device-made descriptors (see _fwd_tile);
                              # 2: that loop rotated for the intra-warp-group overlap (_fwd_inner_overlap)
    SCALE_POS: tl.constexpr,  # qk_scale > 0: the row max is taken before scaling (one FMA per score)
    REVERSE: tl.constexpr,    # the last query block first (causal: the longest programs start first)
    SUBTILES: tl.constexpr,   # 1, or 2 query sub-tiles of BLOCK_M / 2 rows sharing each K/V tile
    PERSISTENT: tl.constexpr,  # a grid of about one program per SM looping over the (query block, head) tiles;
                               # 2 (causal, NUM_M even): over pairs of a heavy and a light query block, head by head
    DEFER: tl.constexpr,      # rescale the accumulator only when a row's max grows by more than 8 (base 2)
    UPCAST: tl.constexpr, IEEE: tl.constexpr, RNE: tl.constexpr,
):
    if PERSISTENT == 2:
        # Pairs (causal, NUM_M even): pair j of head bh is its query blocks NUM_M - 1 - j and j, NUM_M + 1 key
        # blocks together, the same work for every pair; a program runs whole pairs, the heavy block first, and
        # pairs are numbered head by head so that the programs running at once share a few heads' K/V in L2.
        half = NUM_M // 2
        pid = tl.program_id(0)
        for it in tl.range(0, 2 * tl.cdiv(half * NUM_BH - pid, tl.num_programs(0))):
            pair = pid + (it // 2) * tl.num_programs(0)
            bh = pair // half
            start_m = tl.where(it % 2 == 0, NUM_M - 1 - pair % half, pair % half)
            _fwd_tile(start_m, bh, Q, K, V, O, LSE, DO, DELTA, CU_Q, CU_K, K_DESC, V_DESC, K_RB, K_RH, V_RB, V_RH,
                      Q_RB, Q_RH, Q_ROWS, K_ROWS, V_ROWS, qk_scale, stride_qb, stride_qh, stride_qs, stride_kb,
                      stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os,
                      stride_dob, stride_doh, stride_dos, stride_lb, stride_lh, S_Q, S_K, HQ, GROUP, HEAD_DIM,
                      BLOCK_M, BLOCK_N, CAUSAL, VARLEN, STORE_LSE, WITH_DELTA, PRECISE, TMA, WS, SCALE_POS, SUBTILES,
                      DEFER, UPCAST, IEEE, RNE)
    elif PERSISTENT:
        # Tile t of NUM_M * NUM_BH. Causal: the last query blocks of every head first (the longest tiles start
        # first and the short ones fill the tail); else a head's query blocks in a row (its K/V stay in L2).
        for tile in tl.range(tl.program_id(0), NUM_M * NUM_BH, tl.num_programs(0)):
            if CAUSAL:
                start_m = NUM_M - 1 - tile // NUM_BH
                bh = tile % NUM_BH
            else:
                start_m = tile % NUM_M
                bh = tile // NUM_M
            _fwd_tile(start_m, bh, Q, K, V, O, LSE, DO, DELTA, CU_Q, CU_K, K_DESC, V_DESC, K_RB, K_RH, V_RB, V_RH,
                      Q_RB, Q_RH, Q_ROWS, K_ROWS, V_ROWS, qk_scale, stride_qb, stride_qh, stride_qs, stride_kb,
                      stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os,
                      stride_dob, stride_doh, stride_dos, stride_lb, stride_lh, S_Q, S_K, HQ, GROUP, HEAD_DIM,
                      BLOCK_M, BLOCK_N, CAUSAL, VARLEN, STORE_LSE, WITH_DELTA, PRECISE, TMA, WS, SCALE_POS, SUBTILES,
                      DEFER, UPCAST, IEEE, RNE)
    else:
        start_m = tl.program_id(0)
        if REVERSE:
            start_m = tl.num_programs(0) - 1 - start_m
        _fwd_tile(start_m, tl.program_id(1), Q, K, V, O, LSE, DO, DELTA, CU_Q, CU_K, K_DESC, V_DESC, K_RB, K_RH,
                  V_RB, V_RH, Q_RB, Q_RH, Q_ROWS, K_ROWS, V_ROWS, qk_scale, stride_qb, stride_qh, stride_qs,
                  stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os,
                  stride_dob, stride_doh, stride_dos, stride_lb, stride_lh, S_Q, S_K, HQ, GROUP, HEAD_DIM, BLOCK_M,
                  BLOCK_N, CAUSAL, VARLEN, STORE_LSE, WITH_DELTA, PRECISE, TMA, WS, SCALE_POS, SUBTILES, DEFER,
                  UPCAST, IEEE, RNE)


# ---- backward -----------------------------------------------------------------------------------------------------
# For one head with scale c, S = c Q K^T, P = softmax(S) row-wise = exp(S - lse), O = P V. Given dO:
#     dV = P^T dO
#     dP = dO V^T
#     dS = P o (dP - delta),   delta_i = sum_j P_ij dP_ij = sum_j P_ij (dO_i . V_j) = dO_i . O_i
#     dQ = c dS K,   dK = c dS^T Q
# (dS from the softmax Jacobian: dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik).) delta is one dot product per row, computed
# once by _attn_bwd_delta_kernel from O and dO, so neither main kernel needs V's full row of P. P is recomputed from
# q, k and the forward's base-2 lse2 (p = exp2(s c log2e - lse2)) in both main kernels. With GQA, the dK and
# dV of a key/value head sum those of its GROUP query heads.
@triton.jit
def _attn_bwd_delta_kernel(
    O, DO, DELTA, CU_Q,
    stride_ob, stride_oh, stride_os, stride_dob, stride_doh, stride_dos, stride_lb, stride_lh,
    S_Q, HQ,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, VARLEN: tl.constexpr,
):
    """delta[b, h, i] = sum_d O[b, h, i, d] dO[b, h, i, d] (fp32)."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // HQ
    hq = bh % HQ
    q_start, q_len, _, _ = _seq_bounds(CU_Q, CU_Q, b, S_Q, S_Q, VARLEN)
    if start_m * BLOCK_M >= q_len:
        return
    b64, h64 = b.to(tl.int64), hq.to(tl.int64)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = rows < q_len
    q_rows = (q_start + rows).to(tl.int64)[:, None]
    o = tl.load(O + b64 * stride_ob + h64 * stride_oh + q_rows * stride_os + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + b64 * stride_dob + h64 * stride_doh + q_rows * stride_dos + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + b64 * stride_lb + h64 * stride_lh + q_start + rows, delta, mask=row_ok)


# Backward schedules (SCHEDULE, the same in both main kernels; a tile is one block of one (batch, head)):
#   0 the grid (block, head): the hardware launches x fastest, so a head's blocks in a row (the default);
#   1 the grid (head, block): one block of every head in a row (blocks-major);
#   2 persistent: about one program per SM, looping over the tiles numbered head by head, so that the programs
#     running at once share a few heads' Q/dO (dK/dV) or K/V (dQ) in L2;
#   3 persistent pairs (causal, an even number of blocks): pair j of a head is its blocks j and NUM_BLK - 1 - j
#     (the same work for every pair), a program runs whole pairs, numbered head by head.
# FLIP maps the schedule's block i to NUM_BLK - 1 - i: causal, the dQ kernel's heavy blocks are the last ones.
@triton.jit
def _bwd_steps(NUM_BLK, NUM_BH, SCHEDULE: tl.constexpr):
    """Tiles this program runs (persistent schedules)."""
    if SCHEDULE == 3:
        steps = 2 * tl.cdiv((NUM_BLK // 2) * NUM_BH - tl.program_id(0), tl.num_programs(0))
    else:
        steps = tl.cdiv(NUM_BLK * NUM_BH - tl.program_id(0), tl.num_programs(0))
    return steps


@triton.jit
def _bwd_tile(it, NUM_BLK, SCHEDULE: tl.constexpr, FLIP: tl.constexpr):
    """(block, batch * heads index) of this program's tile `it` (0 for the grid schedules)."""
    if SCHEDULE == 3:
        half = NUM_BLK // 2
        pair = tl.program_id(0) + (it // 2) * tl.num_programs(0)
        bh = pair // half
        blk = tl.where(it % 2 == 0, pair % half, NUM_BLK - 1 - pair % half)
    elif SCHEDULE == 2:
        tile = tl.program_id(0) + it * tl.num_programs(0)
        bh = tile // NUM_BLK
        blk = tile % NUM_BLK
    elif SCHEDULE == 1:
        bh = tl.program_id(0)
        blk = tl.program_id(1)
    else:
        blk = tl.program_id(0)
        bh = tl.program_id(1)
    if FLIP:
        blk = NUM_BLK - 1 - blk
    return blk, bh


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_base, do_base, l_base, d_base, dq_base, stride_qs, stride_dos, Q_DESC, DO_DESC,
                q_row, do_row, cols, lo, hi, q_len, k_len, sm_scale, qk_scale, BLOCK_M: tl.constexpr,
                HEAD_DIM: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr,
                SPLIT_DS: tl.constexpr, ATOMIC_DQ: tl.constexpr, SPLIT_DQ: tl.constexpr,
                UPCAST: tl.constexpr, IEEE: tl.constexpr, RNE: tl.constexpr):
    # Query blocks [lo, hi) of one query head against this program's key block (k, v: [BLOCK_N, D]). Transposed
    # tiles (keys on rows) so that dK and dV accumulate with plain dots: dV += P^T dO, dK += dS^T Q.
    # TMA (unmasked ranges only): Q and dO tiles through host descriptors, at rows q_row/do_row + start_m.
    # ATOMIC_DQ: this step's share of dQ, c dS K (dS split as SPLIT_DQ says), added to the fp32 rows at dq_base (Q's
    # strides) with atomics: the dQ kernel, and its recompute of S and dP, is then not launched.
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = q_base + tl.cast(lo, tl.int64) * stride_qs + offs_m[:, None] * stride_qs + offs_d[None, :]
    do_ptrs = do_base + tl.cast(lo, tl.int64) * stride_dos + offs_m[:, None] * stride_dos + offs_d[None, :]
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m
        row_ok = rows < q_len
        q, do = _tile_pair(q_ptrs, do_ptrs, Q_DESC, DO_DESC, q_row + start_m, do_row + start_m, row_ok, MASK, TMA)
        if MASK:
            lse2 = tl.load(l_base + rows, mask=row_ok, other=0.0)
            delta = tl.load(d_base + rows, mask=row_ok, other=0.0)
        else:
            lse2 = tl.load(l_base + rows)
            delta = tl.load(d_base + rows)
        s_t = _mm(k, tl.trans(q), tl.zeros([k.shape[0], BLOCK_M], dtype=tl.float32), UPCAST, IEEE) * qk_scale
        p_t = tl.exp2(s_t - lse2[None, :])
        if MASK:
            ok = row_ok[None, :] & (cols < k_len)[:, None]
            if CAUSAL:
                ok = ok & (cols[:, None] <= rows[None, :])
            p_t = tl.where(ok, p_t, 0.0)
        elif ATOMIC_DQ:  # keys past k_len (zero rows of k) reach dQ here: their p = exp2(-lse2) may overflow
            p_t = tl.where((cols < k_len)[:, None], p_t, 0.0)
        dv = _mm(_operand(p_t, do.dtype, UPCAST), do, dv, UPCAST, IEEE)
        dp_t = _mm(v, tl.trans(do), tl.zeros([k.shape[0], BLOCK_M], dtype=tl.float32), UPCAST, IEEE)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = _ds_product(ds_t, q, dk, SPLIT_DS, UPCAST, IEEE)
        if ATOMIC_DQ:
            dq = _ds_product(tl.trans(ds_t), k, tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32), SPLIT_DQ, UPCAST,
                             IEEE)
            dq_ptrs = dq_base + rows.to(tl.int64)[:, None] * stride_qs + offs_d[None, :]
            if MASK:
                tl.atomic_add(dq_ptrs, dq * sm_scale, mask=row_ok[:, None], sem="relaxed")
            else:
                tl.atomic_add(dq_ptrs, dq * sm_scale, sem="relaxed")
        if MASK or not TMA:
            q_ptrs += BLOCK_M * stride_qs
            do_ptrs += BLOCK_M * stride_dos
    return dk, dv


@triton.jit
def _dkdv_tile(
    start_n, bh, Q, K, V, DO, DK, DV, LSE, DELTA, DQ, CU_Q, CU_K, Q_DESC, DO_DESC, Q_RB, Q_RH, DO_RB, DO_RH, sm_scale,
    qk_scale, stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    stride_lb, stride_lh, S_Q, S_K, HKV, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, VARLEN: tl.constexpr, TMA: tl.constexpr, SPLIT_DS: tl.constexpr,
    ATOMIC_DQ: tl.constexpr, SPLIT_DQ: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, RNE: tl.constexpr,
):
    # Key block start_n of (batch, key/value head) bh; the arguments are _attn_bwd_dkdv_kernel's.
    b = bh // HKV
    hkv = bh % HKV
    q_start, q_len, k_start, k_len = _seq_bounds(CU_Q, CU_K, b, S_Q, S_K, VARLEN)
    if start_n * BLOCK_N >= k_len:
        return
    b64 = b.to(tl.int64)
    n0 = start_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = cols < k_len
    k_rows = (k_start + cols).to(tl.int64)[:, None]
    k = tl.load(K + b64 * stride_kb + hkv.to(tl.int64) * stride_kh + k_rows * stride_ks + offs_d[None, :],
                mask=col_ok[:, None], other=0.0)
    v = tl.load(V + b64 * stride_vb + hkv.to(tl.int64) * stride_vh + k_rows * stride_vs + offs_d[None, :],
                mask=col_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    # Query blocks in three ranges: [a_lo, a_hi) the diagonal ones (causal; masked), [a_hi, b_hi) whole blocks off
    # the diagonal (unmasked), [b_hi, q_len) the partial last block (masked). Keys past k_len in an unmasked step
    # only touch their own rows of dK and dV, which are not stored.
    full_q = (q_len // BLOCK_M) * BLOCK_M
    if CAUSAL:
        a_lo = (n0 // BLOCK_M) * BLOCK_M
        a_hi = tl.minimum(a_lo + tl.cdiv(n0 + BLOCK_N - a_lo, BLOCK_M) * BLOCK_M, q_len)
        b_hi = tl.maximum(a_hi, full_q)
    else:
        a_lo = 0
        a_hi = 0
        b_hi = full_q
    for g in range(0, GROUP):
        hq = hkv * GROUP + g
        h64 = hq.to(tl.int64)
        q_row = b * Q_RB + hq * Q_RH + q_start  # int32: the launcher checks the views have fewer than 2^31 rows
        do_row = b * DO_RB + hq * DO_RH + q_start
        q_base = Q + b64 * stride_qb + h64 * stride_qh + q_start.to(tl.int64) * stride_qs
        do_base = DO + b64 * stride_dob + h64 * stride_doh + q_start.to(tl.int64) * stride_dos
        l_base = LSE + b64 * stride_lb + h64 * stride_lh + q_start
        d_base = DELTA + b64 * stride_lb + h64 * stride_lh + q_start
        dq_base = DQ + b64 * stride_qb + h64 * stride_qh + q_start.to(tl.int64) * stride_qs
        dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, l_base, d_base, dq_base, stride_qs, stride_dos, Q_DESC,
                             DO_DESC, q_row, do_row, cols, a_lo, a_hi, q_len, k_len, sm_scale, qk_scale, BLOCK_M,
                             HEAD_DIM, True, CAUSAL, False, SPLIT_DS, ATOMIC_DQ, SPLIT_DQ, UPCAST, IEEE, RNE)
        dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, l_base, d_base, dq_base, stride_qs, stride_dos, Q_DESC,
                             DO_DESC, q_row, do_row, cols, a_hi, b_hi, q_len, k_len, sm_scale, qk_scale, BLOCK_M,
                             HEAD_DIM, False, CAUSAL, TMA, SPLIT_DS, ATOMIC_DQ, SPLIT_DQ, UPCAST, IEEE, RNE)
        dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, l_base, d_base, dq_base, stride_qs, stride_dos, Q_DESC,
                             DO_DESC, q_row, do_row, cols, b_hi, q_len, q_len, k_len, sm_scale, qk_scale, BLOCK_M,
                             HEAD_DIM, True, CAUSAL, False, SPLIT_DS, ATOMIC_DQ, SPLIT_DQ, UPCAST, IEEE, RNE)
    dk = dk * sm_scale
    store_rounded(DK + b64 * stride_dkb + hkv.to(tl.int64) * stride_dkh + k_rows * stride_dks + offs_d[None, :], dk,
                col_ok[:, None], RNE)
    store_rounded(DV + b64 * stride_dvb + hkv.to(tl.int64) * stride_dvh + k_rows * stride_dvs + offs_d[None, :], dv,
                col_ok[:, None], RNE)


@triton.jit
def _attn_bwd_dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA,
    DQ,                      # ATOMIC_DQ only: fp32 dQ accumulator, zeroed, with Q's strides
    CU_Q, CU_K,
    Q_DESC, DO_DESC,         # TMA only: descriptors over Q and dO seen as [rows, D] (block [BLOCK_M, D])
    Q_RB, Q_RH, DO_RB, DO_RH,  # TMA only: rows of those views per batch and per head
    sm_scale, qk_scale,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos,
    stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    stride_lb, stride_lh,
    S_Q, S_K, HKV,
    NUM_BLK, NUM_BH,         # key blocks per (batch, key/value head), and batch * HKV
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query rows per step of the loop
    BLOCK_N: tl.constexpr,  # key rows held by the program
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, TMA: tl.constexpr,
    SPLIT_DS: tl.constexpr,  # 1: dS as two operands (hi + lo) for the dK product (the `precise` backward), 2: fp16
    ATOMIC_DQ: tl.constexpr,  # dQ here too, through fp32 atomics into DQ (no dQ kernel)
    SPLIT_DQ: tl.constexpr,   # ATOMIC_DQ only: dS split for the dQ product (SPLIT_DS is dK's)
    SCHEDULE: tl.constexpr,  # which program runs which (key block, head) tile: see _bwd_tile
    FLIP: tl.constexpr,      # key block NUM_BLK - 1 - i where the schedule says block i
    UPCAST: tl.constexpr, IEEE: tl.constexpr, RNE: tl.constexpr,
):
    if SCHEDULE >= 2:  # persistent: a loop over this program's tiles
        for it in tl.range(0, _bwd_steps(NUM_BLK, NUM_BH, SCHEDULE)):
            start_n, bh = _bwd_tile(it, NUM_BLK, SCHEDULE, FLIP)
            _dkdv_tile(start_n, bh, Q, K, V, DO, DK, DV, LSE, DELTA, DQ, CU_Q, CU_K, Q_DESC, DO_DESC, Q_RB, Q_RH,
                DO_RB, DO_RH, sm_scale, qk_scale, stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
                stride_vb, stride_vh, stride_vs, stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh,
                stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_lb, stride_lh, S_Q, S_K, HKV, GROUP, HEAD_DIM,
                BLOCK_M, BLOCK_N, CAUSAL, VARLEN, TMA, SPLIT_DS, ATOMIC_DQ, SPLIT_DQ, UPCAST, IEEE, RNE)
    else:
        start_n, bh = _bwd_tile(0, NUM_BLK, SCHEDULE, FLIP)
        _dkdv_tile(start_n, bh, Q, K, V, DO, DK, DV, LSE, DELTA, DQ, CU_Q, CU_K, Q_DESC, DO_DESC, Q_RB, Q_RH, DO_RB,
            DO_RH, sm_scale, qk_scale, stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb,
            stride_vh, stride_vs, stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb,
            stride_dvh, stride_dvs, stride_lb, stride_lh, S_Q, S_K, HKV, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL,
            VARLEN, TMA, SPLIT_DS, ATOMIC_DQ, SPLIT_DQ, UPCAST, IEEE, RNE)


@triton.jit
def _dq_inner(dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs, K_DESC, V_DESC, k_row, v_row, rows, lo,
              hi, k_len, qk_scale, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASK: tl.constexpr,
              CAUSAL: tl.constexpr, TMA: tl.constexpr, SPLIT_DS: tl.constexpr,
              UPCAST: tl.constexpr, IEEE: tl.constexpr, RNE: tl.constexpr):
    # dQ += dS K over key blocks [lo, hi). Keys past k_len must be masked here: their p = exp2(-lse2) can overflow.
    # TMA (unmasked ranges only): K and V tiles through host descriptors, at rows k_row/v_row + start_n.
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    # Pointers advance by BLOCK_N rows a step (64-bit pointers, 32-bit increments: no overflow on long caches).
    k_ptrs = k_base + tl.cast(lo, tl.int64) * stride_ks + offs_n[:, None] * stride_ks + offs_d[None, :]
    v_ptrs = v_base + tl.cast(lo, tl.int64) * stride_vs + offs_n[:, None] * stride_vs + offs_d[None, :]
    for start_n in range(lo, hi, BLOCK_N):
        kv_ok = (start_n + offs_n) < k_len
        k, v = _tile_pair(k_ptrs, v_ptrs, K_DESC, V_DESC, k_row + start_n, v_row + start_n, kv_ok, MASK, TMA)
        s = _mm(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), UPCAST, IEEE) * qk_scale
        p = tl.exp2(s - lse2[:, None])
        if MASK:
            ok = kv_ok[None, :]
            if CAUSAL:
                ok = ok & ((start_n + offs_n)[None, :] <= rows[:, None])
            p = tl.where(ok, p, 0.0)
        dp = _mm(do, tl.trans(v), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), UPCAST, IEEE)
        ds = p * (dp - delta[:, None])
        dq = _ds_product(ds, k, dq, SPLIT_DS, UPCAST, IEEE)
        if MASK or not TMA:
            k_ptrs += BLOCK_N * stride_ks
            v_ptrs += BLOCK_N * stride_vs
    return dq


@triton.jit
def _dq_tile(
    start_m, bh, Q, K, V, DO, DQ, LSE, DELTA, CU_Q, CU_K, K_DESC, V_DESC, K_RB, K_RH, V_RB, V_RH, sm_scale, qk_scale,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, stride_dob,
    stride_doh, stride_dos, stride_dqb, stride_dqh, stride_dqs, stride_lb, stride_lh, S_Q, S_K, HQ,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    VARLEN: tl.constexpr, TMA: tl.constexpr, SPLIT_DS: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    RNE: tl.constexpr,
):
    # Query block start_m of (batch, query head) bh; the arguments are _attn_bwd_dq_kernel's.
    b = bh // HQ
    hq = bh % HQ
    hkv = hq // GROUP
    q_start, q_len, k_start, k_len = _seq_bounds(CU_Q, CU_K, b, S_Q, S_K, VARLEN)
    if start_m * BLOCK_M >= q_len:
        return
    b64, h64 = b.to(tl.int64), hq.to(tl.int64)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = rows < q_len
    q_rows = (q_start + rows).to(tl.int64)[:, None]
    q = tl.load(Q + b64 * stride_qb + h64 * stride_qh + q_rows * stride_qs + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + b64 * stride_dob + h64 * stride_doh + q_rows * stride_dos + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0)
    l_off = b64 * stride_lb + h64 * stride_lh + q_start + rows
    lse2 = tl.load(LSE + l_off, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + l_off, mask=row_ok, other=0.0)
    k_base = K + b64 * stride_kb + hkv.to(tl.int64) * stride_kh + k_start.to(tl.int64) * stride_ks
    v_base = V + b64 * stride_vb + hkv.to(tl.int64) * stride_vh + k_start.to(tl.int64) * stride_vs
    k_row = b * K_RB + hkv * K_RH + k_start  # int32: the launcher checks the views have fewer than 2^31 rows
    v_row = b * V_RB + hkv * V_RH + k_start
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    bulk_hi, hi = _key_bounds(start_m, k_len, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _dq_inner(dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs, K_DESC, V_DESC, k_row, v_row, rows,
                   0, bulk_hi, k_len, qk_scale, BLOCK_N, HEAD_DIM, False, CAUSAL, TMA, SPLIT_DS, UPCAST, IEEE, RNE)
    dq = _dq_inner(dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs, K_DESC, V_DESC, k_row, v_row, rows,
                   bulk_hi, hi, k_len, qk_scale, BLOCK_N, HEAD_DIM, True, CAUSAL, False, SPLIT_DS, UPCAST, IEEE,
                   RNE)
    dq = dq * sm_scale
    store_rounded(DQ + b64 * stride_dqb + h64 * stride_dqh + q_rows * stride_dqs + offs_d[None, :], dq,
                row_ok[:, None], RNE)


@triton.jit
def _attn_bwd_dq_kernel(
    Q, K, V, DO, DQ, LSE, DELTA,
    CU_Q, CU_K,
    K_DESC, V_DESC,          # TMA only: descriptors over K and V seen as [rows, D] (block [BLOCK_N, D])
    K_RB, K_RH, V_RB, V_RH,  # TMA only: rows of those views per batch and per head
    sm_scale, qk_scale,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos, stride_dqb, stride_dqh, stride_dqs,
    stride_lb, stride_lh,
    S_Q, S_K, HQ,
    NUM_BLK, NUM_BH,         # query blocks per (batch, query head), and batch * HQ
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query rows held by the program
    BLOCK_N: tl.constexpr,  # key rows per step of the loop
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, TMA: tl.constexpr,
    SPLIT_DS: tl.constexpr,  # dS as two operands (hi + lo) for the dK / dQ products: the `precise` backward
    SCHEDULE: tl.constexpr,  # which program runs which (query block, head) tile: see _bwd_tile
    FLIP: tl.constexpr,      # query block NUM_BLK - 1 - i where the schedule says block i
    UPCAST: tl.constexpr, IEEE: tl.constexpr, RNE: tl.constexpr,
):
    if SCHEDULE >= 2:  # persistent: a loop over this program's tiles
        for it in tl.range(0, _bwd_steps(NUM_BLK, NUM_BH, SCHEDULE)):
            start_m, bh = _bwd_tile(it, NUM_BLK, SCHEDULE, FLIP)
            _dq_tile(start_m, bh, Q, K, V, DO, DQ, LSE, DELTA, CU_Q, CU_K, K_DESC, V_DESC, K_RB, K_RH, V_RB, V_RH,
                sm_scale, qk_scale, stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb,
                stride_vh, stride_vs, stride_dob, stride_doh, stride_dos, stride_dqb, stride_dqh, stride_dqs,
                stride_lb, stride_lh, S_Q, S_K, HQ, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, VARLEN, TMA, SPLIT_DS,
                UPCAST, IEEE, RNE)
    else:
        start_m, bh = _bwd_tile(0, NUM_BLK, SCHEDULE, FLIP)
        _dq_tile(start_m, bh, Q, K, V, DO, DQ, LSE, DELTA, CU_Q, CU_K, K_DESC, V_DESC, K_RB, K_RH, V_RB, V_RH,
            sm_scale, qk_scale, stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb,
            stride_vh, stride_vs, stride_dob, stride_doh, stride_dos, stride_dqb, stride_dqh, stride_dqs, stride_lb,
            stride_lh, S_Q, S_K, HQ, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, VARLEN, TMA, SPLIT_DS, UPCAST, IEEE,
            RNE)


# ---- launchers ----------------------------------------------------------------------------------------------------
def fwd_config(head_dim: int, device: torch.device, precise: bool = False,
               warp_specialize: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, warps, stages) of the forward; on the interpreter 32 x 32 tiles keep the tests quick and
    still loop. D = 128: 128 x 128 tiles, 8 warps, 3 stages of K/V through TMA (230,424 bytes of shared memory),
    the best of the H200 sweep (do_bench, B4 H32 S4096): 498 TFLOP/s, causal 431
    (pointer 128 x 64 s3: 488 / 426; TMA 128 x 128 s2: 457 / 399; warp_specialize: no change). Other head dims:
    unmeasured starting points. precise (the forward's dP product, attention_fwd_with_delta), as 128 x 128 tiles at
    3 stages beside the dO tile need 263,192 bytes at D = 128: 128 x 64 tiles, 8 warps, 3 stages (fwd+bwd
    with the split backward: 12.61 ms against 12.81 for 128 x 128 at 2 stages, causal 6.73 / 6.85; 64 x 128 x 4
    warps 12.89 / 7.07); other head dims one stage less than the plain forward (unmeasured)."""
    if device.type != "cuda":
        return 32, 32, 4, 1
    if warp_specialize:  # Triton's Hopper pass makes 4 warps 12 (a producer and two consumer warp groups); 3
        # stages of 128-row K and V tiles would pass the shared memory (246 KB at D = 128). H200
        # (benchmarks/sweep_attention_fwd.py, D = 128): 535.9 TFLOP/s, causal 467.6 (default 492.4 / 439.7); with
        # 64-row key blocks it computed inf (so _fwd refuses them)
        return 128, 128, 4, 2 if head_dim <= 128 else 1
    if precise and 64 < head_dim <= 128:
        return 128, 64, 8, 3
    if precise:
        bm, bn, warps, stages = fwd_config(head_dim, device)
        return bm, bn, warps, max(1, stages - 1)
    if head_dim <= 64:
        return 128, 64, 4, 3
    if head_dim <= 128:
        return 128, 128, 8, 3
    return 64, 32, 8, 2


def bwd_config(head_dim: int, device: torch.device) -> tuple[int, int, int, int, int, int]:
    """(dkdv BLOCK_M, dkdv BLOCK_N, dq BLOCK_M, dq BLOCK_N, warps, stages) of the backward. The dK/dV kernel keeps
    two [BLOCK_N, D] fp32 accumulators and K, V; the dQ kernel one accumulator and Q, dO. D = 128, measured on the
    H200 (fwd+bwd with the default forward): TMA loads at 3 stages 403 TFLOP/s (causal 358), at 2 stages
    368 / 329, 32/128 tiles with 4 warps 222 / 193. Other head dims: unmeasured starting points."""
    if device.type != "cuda":
        return 32, 32, 32, 32, 4, 1
    if head_dim <= 64:
        return 64, 128, 128, 64, 4, 3
    if head_dim <= 128:
        return 64, 128, 128, 64, 8, 3
    return 32, 64, 64, 32, 8, 1


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dims: int) -> None:
    what = "[B, H, S, D]" if dims == 4 else "[T, H, D]"
    if q.dim() != dims or k.dim() != dims or v.dim() != dims:
        raise ValueError(f"attention: q, k, v must be {what}, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"attention: q, k, v must share one of fp16/bf16/fp32, got {q.dtype}, {k.dtype}, {v.dtype}")
    d = q.shape[-1]
    if k.shape[-1] != d or v.shape[-1] != d or d not in (16, 32, 64, 128, 256):
        raise ValueError(f"attention: the head dim must be one of 16..256 (a power of two) and equal in q, k, v; "
                         f"got {q.shape[-1]}, {k.shape[-1]}, {v.shape[-1]}")
    hq, hkv = q.shape[1], k.shape[1]
    if v.shape[1] != hkv or hkv == 0 or hq % hkv:
        raise ValueError(f"attention: query heads ({hq}) must be a multiple of key/value heads ({hkv}, {v.shape[1]})")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"attention: k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")


def _unit_d(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _bhs(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, head, sequence) strides of a [B, H, S, D] tensor, or of a packed [T, H, D] one (batch stride 0)."""
    if t.dim() == 4:
        return t.stride(0), t.stride(1), t.stride(2)
    return 0, t.stride(1), t.stride(0)


def _want_tma(x: torch.Tensor, tma: bool | None) -> bool:
    """tma=None: on where the TMA unit exists (sm_90 and later); off on the CPU interpreter, where it is slower
    and is tested by asking for it (tma=True)."""
    if tma is None:
        return x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9
    return bool(tma)


def _row_view(t: torch.Tensor) -> tuple[int, int, int] | None:
    """t [B, H, S, D] (unit stride along D) as one [rows, D] matrix of row stride t.stride(2), the view a TMA
    descriptor reads: (rows per batch, rows per head, rows), so that row b*RB + h*RH + s is t[b, h, s]. None where
    the descriptor cannot read t: not fp16/bf16, a base or row stride that is not 16-byte aligned, batch or head
    strides that are not whole rows (a packed [T, H, D] layout), or 2^31 rows or more (int32 coordinates)."""
    b, h, s, d = t.shape
    sb, sh, ss = t.stride(0), t.stride(1), t.stride(2)
    if t.dtype not in (torch.float16, torch.bfloat16) or t.numel() == 0 or ss < d:
        return None
    if (ss * t.element_size()) % 16 or t.data_ptr() % 16 or (b > 1 and sb % ss) or (h > 1 and sh % ss):
        return None
    rb = sb // ss if b > 1 else 0
    rh = sh // ss if h > 1 else 0
    rows = (b - 1) * rb + (h - 1) * rh + s
    return (rb, rh, rows) if rows < 2 ** 31 else None


def _descs(pairs, block_rows: int):
    """(descriptors, row strides) for the tensors of `pairs` ((tensor, its _row_view), ...), block [block_rows, D];
    (the tensors themselves, zeros) when any view is None: the kernel's TMA flag is then off, the arguments unused."""
    if any(view is None for _, view in pairs):
        return [t for t, _ in pairs], [0] * (2 * len(pairs)), False
    descs = [TensorDescriptor(t, [view[2], t.shape[-1]], [t.stride(2), 1], [block_rows, t.shape[-1]])
             for t, view in pairs]
    return descs, [r for _, view in pairs for r in view[:2]], True


def _modes(x: torch.Tensor) -> dict:
    interp = x.device.type != "cuda"
    return dict(UPCAST=interp, IEEE=x.dtype == torch.float32, RNE=interp and x.dtype == torch.bfloat16)


def _fwd(q, k, v, causal, sm_scale, config, varlen, store_lse=True, do=None, tma=None, warp_specialize=False,
         reverse=None, precise=False, subtiles=1, persistent=False, defer_rescale=False, overlap=False,
         pairs=False):
    # q, k, v: [B, H, S, D] (varlen None) or [T, H, D] with varlen = (cu_q, cu_k, max_q, max_k). tma, warp_specialize,
    # reverse, subtiles, persistent, defer_rescale, overlap, pairs: see attention_fwd.
    d = q.shape[-1]
    hq, hkv = q.shape[1], k.shape[1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    precise = bool(precise) and do is not None
    if subtiles not in (1, 2) or (subtiles == 2 and precise):
        raise ValueError(f"attention: subtiles must be 1 or 2 (1 with precise=True), not {subtiles!r}")
    if persistent and varlen is not None:
        raise ValueError("attention: persistent scheduling is for dense [B, H, S, D] inputs, not packed sequences")
    if overlap and (not warp_specialize or precise or defer_rescale):
        raise ValueError("attention: overlap is an option of the warp-specialised path without precise or "
                         "defer_rescale: pass warp_specialize=True")
    if pairs and not persistent:
        raise ValueError("attention: pairs is a persistent schedule: pass persistent=True")
    bm, bn, warps, stages = config or fwd_config(d, q.device, precise, bool(warp_specialize))
    if warp_specialize and q.is_cuda and bn != 128:
        raise ValueError(f"attention: warp_specialize with {bn}-row key blocks computes wrong results (seen on the "
                         "H200, triton 3.6); give it BLOCK_N 128")
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if varlen is None:
        batch, s_q, s_k = q.shape[0], q.shape[2], k.shape[2]
        lse = torch.empty((batch, hq, s_q), dtype=torch.float32, device=q.device)
        cu_q = cu_k = lse  # unused
        l_strides = (lse.stride(0), lse.stride(1))
        grid_m = s_q
    else:
        cu_q, cu_k, max_q, max_k = varlen
        batch, s_q, s_k = cu_q.shape[0] - 1, max_q, max_k
        lse = torch.empty((hq, q.shape[0]), dtype=torch.float32, device=q.device)
        l_strides = (0, lse.stride(0))
        grid_m = max_q
    delta = torch.empty_like(lse) if do is not None else None
    if o.numel() == 0 or batch == 0:
        return o, lse, delta
    # TMA for the unmasked key blocks: dense layouts only (packed sequences and unaligned strides keep pointers),
    # and only where a whole block of keys exists.
    use_tma = varlen is None and s_k >= bn and _want_tma(q, tma)
    descs, kv_rows, use_tma = _descs(((k, _row_view(k)), (v, _row_view(v))) if use_tma else ((k, None), (v, None)),
                                     bn)
    # The warp-specialised single loop: descriptors over Q, K and V made in the kernel, keys filling whole blocks
    # (causal: whole diagonal blocks too), qk_scale > 0 (the causal -inf goes through the FMA); precise: dO comes
    # through a descriptor too, addressed with Q's row coordinates, so its view must be Q's.
    # Where one of these fails the launch keeps the two-loop path, as `tma` does.
    views = [_row_view(t) for t in (q, k, v)] if use_tma and warp_specialize else [None]
    use_ws = (all(view is not None for view in views) and s_k % bn == 0 and (not causal or bm % bn == 0)
              and scale > 0 and subtiles == 1 and (not precise or _row_view(do) == views[0]))
    if use_ws:
        _set_scratch_allocator(q.device)
    q_rows = views[0][:2] if use_ws else (0, 0)
    rows = [view[2] for view in views] if use_ws else [0, 0, 0]
    num_m = triton.cdiv(grid_m, bm)
    persistent_code = 2 if persistent and pairs and causal and num_m % 2 == 0 else bool(persistent)
    if persistent:
        work = num_m * batch * hq // (2 if persistent_code == 2 else 1)  # tiles, or pairs of tiles
        programs = min(work, sm_count(q.device) * int(persistent))
        grid = (programs, 1)
    else:
        grid = (num_m, batch * hq)
    _attn_fwd_kernel[grid](
        q, k, v, o, lse, do if do is not None else q, delta if do is not None else lse, cu_q, cu_k, *descs, *kv_rows,
        *q_rows, *rows, scale * 1.4426950408889634, *_bhs(q), *_bhs(k), *_bhs(v), *_bhs(o),
        *_bhs(do if do is not None else q), *l_strides, s_q, s_k, hq, num_m, batch * hq,
        GROUP=hq // hkv, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=bool(causal), VARLEN=varlen is not None,
        STORE_LSE=store_lse, WITH_DELTA=do is not None, PRECISE=precise, TMA=use_tma,
        WS=2 if use_ws and overlap else use_ws,
        SCALE_POS=scale > 0, REVERSE=bool(causal) if reverse is None else bool(reverse), SUBTILES=subtiles,
        PERSISTENT=persistent_code, DEFER=bool(defer_rescale),
        num_warps=warps, num_stages=stages, **_modes(q),
    )
    return o, lse, delta


def _set_scratch_allocator(device: torch.device) -> None:
    """Descriptors made in a kernel (tl.make_tensor_descriptor) live in global scratch memory that Triton asks the
    host for through this allocator."""
    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, dtype=torch.int8, device=device)

    triton.set_allocator(alloc)


def _grad_like(t: torch.Tensor, bshd: bool) -> torch.Tensor:
    if bshd and t.dim() == 4:  # [B, S, H, D] storage seen as [B, H, S, D], as SDPA's backward returns it
        return torch.empty((t.shape[0], t.shape[2], t.shape[1], t.shape[3]), dtype=t.dtype,
                           device=t.device).transpose(1, 2)
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


# attention_bwd's schedule names -> the kernels' SCHEDULE codes (see _bwd_tile)
BWD_SCHEDULES = {"grid": 0, "heavy_first": 0, "blocks_major": 1, "persistent": 2, "pairs": 3}


def _bwd_launch(schedule: str, causal: bool, num_blk: int, num_bh: int, dq: bool, device: torch.device):
    """(grid, SCHEDULE, FLIP) of one backward kernel over num_blk blocks of num_bh heads. Every schedule but "grid"
    runs a causal launch's heavy blocks first (the dQ kernel's are its last, FLIP); "pairs" falls back to
    "persistent" where the blocks do not pair (not causal, or an odd number)."""
    code = BWD_SCHEDULES[schedule]
    if code == 3 and not (causal and num_blk % 2 == 0):
        code = 2
    flip = bool(causal and dq and schedule != "grid")
    if code >= 2:
        work = num_blk * num_bh // (2 if code == 3 else 1)  # tiles, or pairs of tiles
        return (min(work, sm_count(device)),), code, flip
    return ((num_blk, num_bh) if code == 0 else (num_bh, num_blk)), code, flip


def _bwd(do, q, k, v, o, lse, causal, sm_scale, config, varlen, delta=None, bshd=False, tma=None, split_ds=False,
         dq_atomic=False, schedule="grid"):
    d = q.shape[-1]
    hq, hkv = q.shape[1], k.shape[1]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    if schedule not in BWD_SCHEDULES:
        raise ValueError(f"attention_bwd: schedule must be one of {', '.join(BWD_SCHEDULES)}; not {schedule!r}")
    if schedule in ("persistent", "pairs") and varlen is not None:
        raise ValueError("attention: persistent scheduling is for dense [B, H, S, D] inputs, not packed sequences")
    config = tuple(config or bwd_config(d, q.device))
    if len(config) not in (6, 8):
        raise ValueError(f"attention_bwd: config is (dkdv BLOCK_M, dkdv BLOCK_N, dq BLOCK_M, dq BLOCK_N, warps, "
                         f"stages[, dq warps, dq stages]); got {config!r}")
    m1, n1, m2, n2, warps, stages = config[:6]
    dq_warps, dq_stages = config[6:] or (warps, stages)
    dq, dk, dv = _grad_like(q, bshd), _grad_like(k, bshd), _grad_like(v, bshd)
    have_delta = delta is not None
    delta = delta if have_delta else torch.empty_like(lse)
    if varlen is None:
        batch, s_q, s_k = q.shape[0], q.shape[2], k.shape[2]
        cu_q = cu_k = lse
        l_strides = (lse.stride(0), lse.stride(1))
    else:
        cu_q, cu_k, s_q, s_k = varlen
        batch = cu_q.shape[0] - 1
        l_strides = (0, lse.stride(0))
    if batch == 0 or (dq.numel() == 0 and dk.numel() == 0):
        return dq, dk, dv
    if k.shape[-2] == 0 or s_k == 0 or dq.numel() == 0:  # no keys or no queries: zero gradients
        return dq.zero_(), dk.zero_(), dv.zero_()
    modes = _modes(q)
    common = dict(HEAD_DIM=d, VARLEN=varlen is not None)
    if not have_delta:
        _attn_bwd_delta_kernel[(triton.cdiv(s_q, 64 if q.is_cuda else 32), batch * hq)](
            o, do, delta, cu_q, *_bhs(o), *_bhs(do), *l_strides, s_q, hq,
            BLOCK_M=64 if q.is_cuda else 32, num_warps=4, **common,
        )
    qk_scale = scale * 1.4426950408889634
    if split_ds not in (False, True, "dq", "dk", "fp16"):
        raise ValueError(f"attention_bwd: split_ds must be True, False, 'dq' or 'dk' (that product only), or 'fp16'; "
                         f"not {split_ds!r}")
    # each product's SPLIT_DS: 0 dS rounded once, 1 split in two (hi + lo), 2 one fp16 product
    split_dk, split_dq = ((2, 2) if split_ds == "fp16" else
                          (int(split_ds in (True, "dk")), int(split_ds in (True, "dq"))))
    common.update(GROUP=hq // hkv, CAUSAL=bool(causal), **modes)
    if dq_atomic and not q.is_contiguous():  # (dQ's fp32 accumulator is addressed with q's strides)
        q = q.contiguous()
    # TMA for the unmasked blocks of each loop (dense layouts, a whole block at least), as in the forward.
    want = varlen is None and _want_tma(q, tma)
    qdo = ((q, _row_view(q)), (do, _row_view(do))) if want and s_q >= m1 else ((q, None), (do, None))
    q_descs, q_rows, tma_dkdv = _descs(qdo, m1)
    kv = ((k, _row_view(k)), (v, _row_view(v))) if want and s_k >= n2 else ((k, None), (v, None))
    kv_descs, kv_rows, tma_dq = _descs(kv, n2)
    # dq_atomic: the dK/dV kernel adds each step's dQ share into an fp32 accumulator addressed with Q's strides
    # (contiguous, as q is made above), rounded into dq at the end; the dQ kernel is then not launched.
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if dq_atomic else dq
    num_n = triton.cdiv(s_k, n1)
    grid, code, flip = _bwd_launch(schedule, causal, num_n, batch * hkv, False, q.device)
    _attn_bwd_dkdv_kernel[grid](
        q, k, v, do, dk, dv, lse, delta, dq_acc, cu_q, cu_k, *q_descs, *q_rows, scale, qk_scale,
        *_bhs(q), *_bhs(k), *_bhs(v), *_bhs(do), *_bhs(dk), *_bhs(dv), *l_strides, s_q, s_k, hkv, num_n, batch * hkv,
        BLOCK_M=m1, BLOCK_N=n1, TMA=tma_dkdv, SPLIT_DS=split_dk, ATOMIC_DQ=bool(dq_atomic), SPLIT_DQ=split_dq,
        SCHEDULE=code, FLIP=flip, num_warps=warps, num_stages=stages, **common,
    )
    if dq_atomic:
        return dq.copy_(dq_acc), dk, dv
    num_m = triton.cdiv(s_q, m2)
    grid, code, flip = _bwd_launch(schedule, causal, num_m, batch * hq, True, q.device)
    _attn_bwd_dq_kernel[grid](
        q, k, v, do, dq, lse, delta, cu_q, cu_k, *kv_descs, *kv_rows, scale, qk_scale,
        *_bhs(q), *_bhs(k), *_bhs(v), *_bhs(do), *_bhs(dq), *l_strides, s_q, s_k, hq, num_m, batch * hq,
        BLOCK_M=m2, BLOCK_N=n2, TMA=tma_dq, SPLIT_DS=split_dq, SCHEDULE=code, FLIP=flip, num_warps=dq_warps,
        num_stages=dq_stages, **common,
    )
    return dq, dk, dv


def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  sm_scale: float | None = None, config: tuple[int, int, int, int] | None = None,
                  store_lse: bool = True, tma: bool | None = None, warp_specialize: bool = False,
                  reverse: bool | None = None, subtiles: int = 1, persistent: bool | int = False,
                  defer_rescale: bool = False, overlap: bool = False,
                  pairs: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B, Hq, Sq, D], lse2 [B, Hq, Sq] fp32) of softmax(q k^T * scale) v; scale defaults to 1/sqrt(D).
    lse2 is the log-sum-exp of the scaled scores in base 2 (multiply by ln 2 for the natural one).
    Variants (the same softmax; the defaults are the measured best): config (BLOCK_M, BLOCK_N, warps, stages);
    tma: K/V tiles of the unmasked key blocks through TMA descriptors (None: on sm_90+ GPUs; layouts a descriptor
    cannot read keep pointers, whatever tma says); reverse: the query blocks in reverse launch order (None: when
    causal, so that the longest programs start first). The Hopper variants, after Triton's fused-attention
    tutorial: warp_specialize: one key loop (the causal mask inside) over descriptors made in the kernel, under
    tl.range(warp_specialize=True), which Triton 3.6 compiles at 4 warps into a TMA producer warp group and two
    consumer warp groups of BLOCK_M / 2 rows (default config 128 x 128 x 4 warps x 2 stages; kept off where the
    keys do not fill whole blocks, the layout is not TMA-readable or scale <= 0); subtiles=2: two query sub-tiles
    of BLOCK_M / 2 rows share each K/V tile, the second's QK^T issued before the first's softmax (meant for
    BLOCK_M 256 at 8 warps or 128 at 4); persistent: about `persistent` programs per SM (True: 1) looping over the
    (query block, head) tiles, causal the longest first; defer_rescale: the running max moves only when a row's
    grows by more than 8 (base 2), and the accumulator's rescale is skipped until then (FlashAttention-4);
    overlap (with warp_specialize): the key loop rotated so that each step issues the next block's QK^T before
    the previous block's softmax output meets V (FlashAttention-3's intra-warp-group overlap; one block's products
    more a query block); pairs (with persistent, causal, an even number of query blocks): each program runs whole
    pairs of a head's query blocks NUM_M - 1 - j and j (equal work per pair), head by head (else the
    longest-first order); both off by default (benchmarks/sweep_attention_fwd.py measures them)."""
    _check_qkv(q, k, v, 4)
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"attention: batch sizes differ: q {q.shape[0]}, k {k.shape[0]}")
    return _fwd(_unit_d(q), _unit_d(k), _unit_d(v), causal, sm_scale, config, None, store_lse, None, tma,
                warp_specialize, reverse, subtiles=subtiles, persistent=persistent, defer_rescale=defer_rescale,
                overlap=overlap, pairs=pairs)[:2]


def attention_fwd_with_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                             causal: bool = False, sm_scale: float | None = None, config=None,
                             tma: bool | None = None, warp_specialize: bool = False, reverse: bool | None = None,
                             precise: bool = False, subtiles: int = 1, persistent: bool | int = False,
                             defer_rescale: bool = False, pairs: bool = False):
    """(o, lse, delta) when the upstream gradient do is known at forward time (a fused forward + backward): the
    forward's epilogue computes delta = rowsum(do o o) from the fp32 o, which saves the backward's preprocess
    kernel (a read of o and do) and the error of o's rounding. Pass delta to attention_bwd. precise: delta =
    sum_j P_ij dP_ij from the unrounded P instead (dP = dO V^T, one more product a key block), so each row's dS sum
    to zero; with attention_bwd(split_ds=True) it is the `precise` backward (the default's dq and dk
    fall outside the harness's bound where few keys take a row; what it costs: docs/results.md). The other variants:
    see attention_fwd (subtiles=2 with precise=False only); warp_specialize with precise: dO comes through a
    descriptor made in the kernel as Q does, where dO's [rows, D] view is Q's (else the two-loop path), and the
    dP product runs in the consumer warp groups (sm_90: 213 KB at 128 x 128 x 2 stages; persistent does not fit
    there; benchmarks/sweep_attention_bwd.py --schedules measures it persistent, and with pairs, at 1 stage)."""
    _check_qkv(q, k, v, 4)
    if q.shape[0] != k.shape[0] or do.shape != q.shape:
        raise ValueError(f"attention: q {tuple(q.shape)}, k {tuple(k.shape)} and do {tuple(do.shape)} do not fit")
    return _fwd(_unit_d(q), _unit_d(k), _unit_d(v), causal, sm_scale, config, None, True, _unit_d(do), tma,
                warp_specialize, reverse, precise, subtiles, persistent, defer_rescale, pairs=pairs)


def attention_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                  lse: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
                  config: tuple[int, int, int, int, int, int] | None = None, delta: torch.Tensor | None = None,
                  bshd_grads: bool = False, tma: bool | None = None, split_ds: bool | str = False,
                  dq_atomic: bool = False, schedule: str = "grid"):
    """(dq, dk, dv) of attention_fwd for the upstream gradient do, from the forward's o and lse (and delta, when
    attention_fwd_with_delta made it; else the preprocess kernel computes it from o and do). bshd_grads: the
    gradients in [B, S, H, D] storage (transposed views), the layout SDPA's CPU backward returns. tma: Q/dO
    (dK/dV kernel) and K/V (dQ kernel) tiles of the unmasked blocks through TMA descriptors, as in attention_fwd.
    split_ds: dS enters the dK and dQ products as two operands, its bf16 rounding and the rest (one more product
    in each loop), instead of rounded once; "dq" or "dk": in that product only; "fp16": dS rounded to fp16 (3 more
    bits than bf16) in one product with the other operand converted to fp16, in both products (0.66 ms
    faster non-causal, 0.2 ms slower causal; overflows past 65504). dq_atomic (FlashAttention-2's layout:
    0.43x, the atomics cost more than the dQ kernel's recompute): the dK/dV kernel also computes dQ's share of
    each step, c dS K, and adds it into an fp32 accumulator with atomics (order-dependent rounding: not bitwise
    repeatable), so the dQ kernel, which recomputes S and dP
    (2 of the backward's 5 products, 2 of 7 with split_ds), is not launched; config's dQ tile is then unused.
    config: (dK/dV BLOCK_M, BLOCK_N, dQ BLOCK_M, BLOCK_N, warps, stages), and optionally the dQ kernel's own warps
    and stages as two more entries (else the same). schedule (dense inputs; benchmarks/sweep_attention_bwd.py
    --schedules measures them): which program runs which (block, head) tile of both kernels: "grid" (the default:
    a head's blocks launched in a row, in index order), "heavy_first" (the same, but a causal dQ launch takes its
    query blocks last-first, the longest first), "blocks_major" (the grid's axes swapped: one block of every head
    in a row), "persistent" (one program per SM looping over the tiles head by head), "pairs" (causal: persistent
    over pairs of a heavy and a light block of one head, head by head; else "persistent"); all but "grid" run a
    causal launch's heavy blocks first."""
    _check_qkv(q, k, v, 4)
    if do.shape != q.shape or o.shape != q.shape or lse.shape != q.shape[:3]:
        raise ValueError(f"attention_bwd: do and o must have q's shape {tuple(q.shape)} and lse {tuple(q.shape[:3])}")
    if delta is not None and delta.shape != lse.shape:
        raise ValueError(f"attention_bwd: delta must have lse's shape {tuple(lse.shape)}")
    return _bwd(_unit_d(do), _unit_d(q), _unit_d(k), _unit_d(v), _unit_d(o), lse.contiguous(), causal, sm_scale,
                config, None, None if delta is None else delta.contiguous(), bshd_grads, tma, split_ds, dq_atomic,
                schedule)


def _check_varlen(q, k, v, cu_q, cu_k):
    _check_qkv(q, k, v, 3)
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if cu.dim() != 1 or cu.dtype != torch.int32 or cu.shape[0] < 1:
            raise ValueError(f"attention_varlen: {name} must be a 1-D int32 tensor of batch + 1 offsets")
    if cu_q.shape != cu_k.shape:
        raise ValueError("attention_varlen: cu_seqlens_q and cu_seqlens_k must have the same length")


def attention_varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                         sm_scale: float | None = None, config=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed sequences: q [Tq, Hq, D], k/v [Tk, Hkv, D]; sequence b holds rows cu_seqlens[b]:cu_seqlens[b+1].
    Returns (o [Tq, Hq, D], lse2 [Hq, Tq] fp32, base 2 as in attention_fwd). max_seqlen_* (host ints, as
    FlashAttention takes them) size the grid; a sequence longer than max_seqlen_q would be left partly unwritten."""
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k)
    varlen = (cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), int(max_seqlen_q), int(max_seqlen_k))
    return _fwd(_unit_d(q), _unit_d(k), _unit_d(v), causal, sm_scale, config, varlen)[:2]


def attention_varlen_bwd(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                         causal: bool = False, sm_scale: float | None = None, config=None):
    """(dq, dk, dv) of attention_varlen_fwd; lse is the forward's [Hq, Tq]."""
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k)
    varlen = (cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), int(max_seqlen_q), int(max_seqlen_k))
    return _bwd(_unit_d(do), _unit_d(q), _unit_d(k), _unit_d(v), _unit_d(o), lse.contiguous(), causal, sm_scale,
                config, varlen)


class FlashAttention(torch.autograd.Function):
    """softmax(q k^T * scale) v with the backward above; saves q, k, v, o and the lse (no S x S matrix)."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, sm_scale=None):
        o, lse = attention_fwd(q, k, v, causal, sm_scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.sm_scale = causal, sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attention_bwd(do, q, k, v, o, lse, ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None


def flash_attention(q, k, v, causal: bool = False, sm_scale: float | None = None) -> torch.Tensor:
    return FlashAttention.apply(q, k, v, causal, sm_scale)


def hopper_fwd_variant(q: torch.Tensor, causal: bool) -> dict:
    """The forward's launch options measured best on the H200 at D = 128 (B4 H32 S4096 bf16, do_bench):
    warp-specialised at 128 x 128 x 4 warps x 2 stages, persistent: 560.8 TFLOP/s non-causal (default
    492.4). Causal, persistent over pairs of a heavy and a light query block head by head (525.5 TFLOP/s,
    0.994x cuDNN's 528.4; the same kernel without persistence 450.1, persistent longest-first 406.7); where the
    query blocks cannot pair (an odd number), not persistent. Elsewhere the default."""
    if not q.is_cuda or q.shape[-1] != 128 or torch.cuda.get_device_capability(q.device)[0] != 9:
        return {}
    if not causal:
        return {"warp_specialize": True, "persistent": True}
    pairs = triton.cdiv(q.shape[-2], 128) % 2 == 0
    return {"warp_specialize": True, "persistent": pairs, "pairs": pairs}


def gluon_fwd_variant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> dict | None:
    """The knobs of the Gluon FA3-style forward (seeds/attention_gluon.py) where it is measured to pay, else None
    (the Triton kernels here run). Measured on the H200 at D = 128, B4 H32 S4096 bf16, `crucible bench` (sustained,
    every check stage): non-causal, two 64-row consumer warp groups without the GEMM token, persistent: 607.7
    TFLOP/s, 1.017x cuDNN SDPA [1.015, 1.022] (the same not persistent 598.5-599.2, 1.002-1.013x);
    causal, ping-pong persistent over pairs of query tiles: 571.2 TFLOP/s, 1.092x cuDNN [1.089, 1.096]
    This file's Triton launch: 539.4 / 470.3. It takes dense contiguous q, k, v of one shape
    (no GQA), bf16/fp16, S a multiple of 128 (causal: an even number of 128-row tiles), on sm_90 only."""
    if not (q.is_cuda and q.dim() == 4 and k.shape == q.shape and v.shape == q.shape and q.shape[-1] == 128):
        return None
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return None
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()) or q.numel() == 0:
        return None
    if torch.cuda.get_device_capability(q.device)[0] != 9 or q.shape[2] % 128:
        return None
    if not causal:
        return {"consumers": 2, "pingpong": False, "persistent": True}
    if (q.shape[2] // 128) % 2:
        return None
    return {"consumers": 2, "pingpong": True, "persistent": True}


class ModelNew(nn.Module):
    """tasks/attention_fwd.py and tasks/attention_fwd_causal.py: o = SDPA(q, k, v, is_causal=causal)."""

    def __init__(self, causal: bool = False):
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        gluon = gluon_fwd_variant(q, k, v, self.causal)
        if gluon is not None:
            return attention_fwd_gluon(q, k, v, self.causal, **gluon)[0]
        return attention_fwd(q, k, v, self.causal, store_lse=False, **hopper_fwd_variant(q, self.causal))[0]

