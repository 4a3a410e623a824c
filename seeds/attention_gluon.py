"""Attention forward for Hopper (sm_90) in Gluon (triton.experimental.gluon), in the FlashAttention-3 style.

What: o = softmax(q k^T * scale) v and the base-2 log-sum-exp lse2 = log2(sum_j exp2(s_ij)) of the scaled scores
s = q k^T * scale * log2(e), the forward contract of seeds/attention.py's attention_fwd (o [B, H, S, D] in the
input dtype, lse2 [B, H, S] fp32; multiply lse2 by ln 2 for the natural log-sum-exp). Causal masks are top-left
aligned (key j seen by query i when j <= i), as SDPA's is_causal.
Shapes: dense q, k, v [B, H, S, D], the same B, H and S for all three (no GQA, no varlen), bf16 or fp16,
D in (64, 128), S a multiple of block_m and block_n, scale > 0; the launcher raises ValueError on anything else
(seeds/attention.py covers the rest). CUDA sm_90 only: Gluon does not run on Triton's CPU interpreter.
FLOPs: 4 B H S^2 D (half of it causal); at B4 H32 S4096 D128: 1.10 TFLOP (0.55 causal).

The schedule. Tiles are (query tile of BLOCK_M rows, batch x head), head by head (so that the programs running
at once share a few heads' K/V in L2), causal a head's longest tiles first. One program a tile (the grid), or
PERSISTENT: one program an SM looping over tiles pid, pid + P, ...; causal persistent runs pairs of a head's
query tiles NUM_M - 1 - j and j (NUM_M + 1 key blocks a pair, equal work; seeds/attention.py's `pairs`).
- gl.warp_specialize splits a program into a 1-warp TMA producer partition (setmaxnreg 24) and the consumers
  (240). The producer loads each tile's Q (once the consumers' last QK^T of the previous tile has read the
  buffer) and streams K and V of the key blocks through a STAGES-deep shared-memory ring: per stage one K and one
  V buffer, each with a "ready" mbarrier (TMA transaction bytes) and an "empty" one (one arrival per consumer
  partition). K and V have their own barriers so that a block's QK^T may start before its V lands and its K slot
  is handed back as soon as QK^T completes. The ring's slot and phase counters run on across tiles.
- Consumers (wgmma's M is 64 rows a warp group): cooperative (consumers=1): the default partition has 8 warps,
  wgmma layout [8, 1], so its two warp groups each own 64 rows of the 128-row tile in one instruction stream
  (FA3's two MMA warp groups; Triton's barrier before each mbarrier arrival syncs the two); consumers=2: two
  4-warp consumer partitions (the default and a worker), 64 rows each, sharing every K/V stage; with pingpong
  (the default for 2) their GEMMs are ordered by two mbarriers used as a token (FA3's warp-scheduler barriers;
  Gluon exposes no named barriers): a consumer waits for the token before issuing a step's GEMMs and passes it
  right after issuing them, so one warp group's softmax runs while the other's GEMMs hold the tensor cores.
- In each consumer, FA3's intra-warp-group overlap with asynchronous wgmma: step i issues S_i = Q K_i^T (both
  from shared memory), rescales O by the previous step's alpha, issues O += P_{i-1} V_{i-1} (P from registers),
  then warpgroup_mma_wait(1) waits for S_i alone, so the softmax of block i (m' = max(m, rowmax(s) c),
  p = exp2(s c - m') with the scale c = scale log2(e) folded into one FMA, l' = l alpha + rowsum p) runs while
  P_{i-1} V_{i-1} is still on the tensor cores; warpgroup_mma_wait(0) then retires it. Key blocks run last-first,
  so that when causal the one diagonal block (block_n == block_m) is the prologue's, the only one with a mask.
- Epilogue: o = acc / l to shared memory (the Q buffer; PERSISTENT: its own buffer, the TMA store left in flight
  into the next tile), TMA store; lse2 = m + log2(l) by pointer store.
Knobs (attention_fwd_gluon keywords; VARIANTS names the measured set): block_m (128), block_n (128, or 64
non-causal), stages (2, 3 or, at block_n 64, 4: the ring within the 227 KB a block may use; 3 at 128 x 128 takes
224 KB, so not with PERSISTENT's extra 32 KB o buffer), consumers (1 cooperative, 2 partitions), pingpong,
persistent, maxnreg (the launch's register cap the partitions' setmaxnreg share out: 12 warps at 168).
Compiled for sm_90 (tests/test_attention_gluon.py; triton 3.6 and 3.9 alike): every variant at 168 registers a
thread at launch (setmaxnreg 240 consumers / 24 producer), no spills, wgmma.wait_group 1 kept in the key loop,
160 KB of shared memory at 2 stages, 224 KB at 3, 192 KB persistent. CPU mirrors of the maths order and of the
mbarrier protocol (random interleavings): tests/test_attention_gluon_schedule.py.

The do= option (WITH_DELTA; measured on the H200): the forward of a fused forward
+ backward also returns delta = sum_j P_ij dP_ij, dP = dO V^T, P the normalised fp32 softmax (before its bf16
rounding for P V): seeds/attention.py's attention_fwd_with_delta(precise=True) convention, the delta that
attention_bwd(delta=, split_ds=True) takes. The producer loads each consumer's dO tile with its Q tile (one
barrier, both byte counts; freed with Q). Each consumer, once block i's softmax is done and P_{i-1} V_{i-1} has
retired (so P's bf16 operand registers are free), waits for V_i's stage (the one its P V uses next step: no
change to the ring's protocol), issues dP_i = dO V_i^T as two 64-column wgmma waited in turn (a [64, 64] fp32
half at a time, 32 registers a thread) outside the GEMM token, and takes dsum = dsum alpha + rowsum(p dP_i) with
block i's fp32 p (alpha the same rescale as l's); delta = dsum / l, stored as lse2. Compiled for sm_90 (triton 3.6
and 3.9): the 128 x 64 variants spill nothing; the 128 x 128 ones spill a few loop-invariant scalars (Q's wgmma
descriptors; stack 104-184 bytes under triton 3.9, 0-144 under 3.6: the consumers' 240 registers and the uniform registers run out with the third
product's descriptors), reloaded once a key block. Shared memory: +block_m x D x 2 bytes (192 KB at 2 stages, 224 KB
persistent; the 3-stage 128 x 128 variants do not fit, delta_ok). Measured (do_bench, B4 H32 S4096 D128, non-causal):
2.75 ms with two consumers and no GEMM token (599.5 TFLOP/s counting its three products), 1.02x the Triton
forward with delta; all variants within the float64 checks.
delta_from="o" (DELTA_O): delta = rowsum(dO o o) from the unrounded fp32 o in the epilogue, dO's rows by pointer
loads in the o accumulator's layout (no dO tiles, no dP product: the plain forward's two products and shared
memory). With fp16 working copies (seeds/attention_gluon_train.py) do_bench measured the forward at 1.836 ms
(non-causal, persistent) / 0.990 ms (causal) against 2.75 with the dP product.

Compatibility: the TMA copies are tma.async_copy_global_to_shared / async_copy_shared_to_global in triton 3.6 (the
H200's) and tma.async_load / async_store in 3.9 (this repository's tests), where the old names raise; the module
picks them by `dir()` (crucible's static checker refuses getattr and try/except, so no hasattr-style probing).
Everything else used (warp_specialize with per-partition warps and registers, mbarrier init/expect/wait/arrive,
warpgroup_mma / warpgroup_mma_wait, NVMMA layouts, host TensorDescriptor) is spelled alike in both.

Measured on the H200 (torch 2.11, triton 3.6), B4 H32 S4096 D128 bf16:
- benchmarks/sweep_attention_gluon.py (do_bench; every variant within 3x SDPA cuDNN's error of float64):
  non-causal: 2 consumers without the token 647.7 TFLOP/s, ping-pong s3 632.9, ping-pong s2 630.4, cooperative s2
  517.1 (its two warp groups kept in step by the barrier before each arrival); cuDNN 684.7 in that run (one call
  at a time: a boost clock), seeds/attention.py's Triton launch 559.4. Causal: ping-pong persistent 583.7 =
  1.111x cuDNN's 525.2, ping-pong s2 553.4, cooperative s2 450.3; the Triton launch 487.6.
- benchmarks/diag_gluon_race.py: every 128 x 128 variant bitwise equal to every other and run to run on
  the harness's outliers, normal, large and constant-row draws, causal and not (6 runs each): no race seen.
- `crucible bench` (sustained, every check stage; seeds/attention.py's ModelNew takes this kernel on sm_90):
  non-causal persistent without the token 607.7 TFLOP/s = 1.017x cuDNN SDPA [1.015, 1.022]; causal
  ping-pong persistent 571.2 = 1.092x [1.089, 1.096].
- Accuracy: like FlashAttention it rounds P to bf16 for P V; against cuDNN's errors alone 1 of 67M elements of o
  fell outside the harness's bound on an outliers draw in 2 of 11 checks; with SDPA's
  FlashAttention-2 backend as the tasks' second reference (the fwd+bwd tasks' rule) 6 of 6 checks passed.
"""
from __future__ import annotations

import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor

from seeds._common import sm_count

# TMA global <-> shared copies: async_copy_global_to_shared / async_copy_shared_to_global in Triton 3.6 (the
# H200's), renamed async_load / async_store later (3.9 here, where the old names raise)
if "async_load" in dir(tma):
    tma_load = tma.async_load
    tma_store = tma.async_store
else:  # Triton 3.6
    tma_load = tma.async_copy_global_to_shared
    tma_store = tma.async_copy_shared_to_global

LOG2E = 1.4426950408889634


@gluon.jit
def _token_wait(turn_bars, CID: gl.constexpr, step, PINGPONG: gl.constexpr):
    """Ping-pong: consumer CID waits for the GEMM token before issuing step `step`'s GEMMs. Consumer 0 holds it
    first (a fresh mbarrier's phase "1" counts as complete), consumer 1 after consumer 0's arrival of that step."""
    if PINGPONG:
        if CID == 0:
            mbarrier.wait(turn_bars.index(0), (step & 1) ^ 1)
        else:
            mbarrier.wait(turn_bars.index(1), step & 1)


@gluon.jit
def _token_pass(turn_bars, CID: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: hand the GEMM token to the other consumer once this step's GEMMs are issued."""
    if PINGPONG:
        mbarrier.arrive(turn_bars.index(1 - CID), count=1)


@gluon.jit
def _p_dp_rowsum(p, do_tile, v_tile, M_C: gl.constexpr, BLOCK_N: gl.constexpr, W: gl.constexpr):
    """WITH_DELTA: rowsum(p * dP) of one key block, dP = dO V^T (dO from do_tile [M_C, D], V from v_tile
    [BLOCK_N, D]), by 64-column wgmma (dO V[0:64]^T then dO V[64:128]^T at BLOCK_N 128) each waited before the
    next: a [M_C, 64] fp32 dP at a time (32 registers a thread, where P_{i-1} V_{i-1}'s bf16 operand lay; a whole
    [64, 128] dP spilled at 240 registers). p: the block's fp32 probabilities in the S accumulator's layout,
    split into its column halves in registers (trivial conversions, asserted)."""
    mma_h: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, 64, 16])
    zero_h = gl.zeros([M_C, 64], gl.float32, mma_h)
    if BLOCK_N == 64:
        dp = warpgroup_mma(do_tile, v_tile.permute((1, 0)), zero_h, use_acc=False, is_async=True)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp,))
        part = gl.sum(gl.convert_layout(p, mma_h, assert_trivial=True) * dp, axis=1)
    else:
        p_lo, p_hi = gl.split(gl.permute(gl.reshape(p, [M_C, 2, 64]), (0, 2, 1)))
        dp = warpgroup_mma(do_tile, v_tile.slice(0, 64).permute((1, 0)), zero_h, use_acc=False, is_async=True)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp,))
        part = gl.sum(gl.convert_layout(p_lo, mma_h, assert_trivial=True) * dp, axis=1)
        dp = warpgroup_mma(do_tile, v_tile.slice(64, 64).permute((1, 0)), zero_h, use_acc=False, is_async=True)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp,))
        part = part + gl.sum(gl.convert_layout(p_hi, mma_h, assert_trivial=True) * dp, axis=1)
    return gl.convert_layout(part, gl.SliceLayout(1, p.type.layout), assert_trivial=True)


@gluon.jit
def _my_tiles(TILES, PAIRS: gl.constexpr):
    """How many tiles this program runs: tiles pid, pid + P, ... (P programs), or with PAIRS two a pair for
    pairs pid, pid + P, ... of the TILES / 2."""
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    if PAIRS:
        n = 2 * gl.cdiv(gl.maximum(TILES // 2 - pid, 0), nprog)
    else:
        n = gl.cdiv(gl.maximum(TILES - pid, 0), nprog)
    return n


@gluon.jit
def _tile(u, S, NUM_M, CID: gl.constexpr, M_C: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
          CAUSAL: gl.constexpr, PAIRS: gl.constexpr):
    """(sequence position, row of the [B*H*S, D] view) of consumer CID's first query row in this program's u-th
    tile, the head's first K/V row and the tile's key-block count. Tiles run head by head (so that the programs
    running at once share a few heads' K/V in L2): tile t = pid + u * programs is query tile t % NUM_M of head
    t // NUM_M, causal a head's longest first; PAIRS (persistent causal, NUM_M even): the program's u-th pair
    pid + (u // 2) * programs of a head's query tiles NUM_M - 1 - j and j (NUM_M + 1 key blocks a pair, the same
    work for every pair), the heavy one first."""
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    if PAIRS:
        half = NUM_M // 2
        pair = pid + (u // 2) * nprog
        bh = pair // half
        j = pair % half
        heavy = (u % 2 == 0).to(gl.int32)
        m = j + heavy * (NUM_M - 1 - 2 * j)
    else:
        t = pid + u * nprog
        m = t % NUM_M
        if CAUSAL:
            m = NUM_M - 1 - m
        bh = t // NUM_M
    kv_row0 = bh * S
    q_pos0 = m * BLOCK_M
    if CAUSAL:
        n_blocks = (q_pos0 + BLOCK_M) // BLOCK_N
    else:
        n_blocks = S // BLOCK_N
    return q_pos0 + CID * M_C, kv_row0 + q_pos0 + CID * M_C, kv_row0, n_blocks


@gluon.jit
def _fa3_loader(q_desc, k_desc, v_desc, do_desc, q_smem, k_smem, v_smem, do_smem, q_bars, q_empty, k_ready, v_ready,
                k_empty, v_empty, S, NUM_M, TILES, M_C: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr, CONSUMERS: gl.constexpr, CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr,
                WITH_DELTA: gl.constexpr):
    """The producer (1 warp): per tile, K of key block n-1, the consumers' Q tiles (WITH_DELTA: and their dO tiles,
    on the same barrier; once the previous tile's consumer has done with both), V of block n-1, then K and V of
    blocks n-2 .. 0, through the STAGES-deep ring."""
    it = 0  # key blocks loaded so far (all tiles): ring slot it % STAGES, use (it // STAGES)
    tc = 0  # tiles so far
    for u in range(0, _my_tiles(TILES, CAUSAL and PERSISTENT)):
        q_pos0, q_row0, kv_row0, n_blocks = _tile(u, S, NUM_M, 0, M_C, BLOCK_M, BLOCK_N, CAUSAL,
                                                  CAUSAL and PERSISTENT)
        for i in range(n_blocks):
            j = it + i
            st = j % STAGES
            ph = (j // STAGES) & 1
            row = kv_row0 + (n_blocks - 1 - i) * BLOCK_N
            mbarrier.wait(k_empty.index(st), ph ^ 1)
            mbarrier.expect(k_ready.index(st), k_desc.block_type.nbytes)
            tma_load(k_desc, [row, 0], k_ready.index(st), k_smem.index(st))
            if i == 0:
                for c in gl.static_range(CONSUMERS):
                    mbarrier.wait(q_empty.index(c), (tc & 1) ^ 1)
                    if WITH_DELTA:
                        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
                        tma_load(q_desc, [q_row0 + c * M_C, 0], q_bars.index(c), q_smem.index(c))
                        tma_load(do_desc, [q_row0 + c * M_C, 0], q_bars.index(c), do_smem.index(c))
                    else:
                        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
                        tma_load(q_desc, [q_row0 + c * M_C, 0], q_bars.index(c), q_smem.index(c))
            mbarrier.wait(v_empty.index(st), ph ^ 1)
            mbarrier.expect(v_ready.index(st), v_desc.block_type.nbytes)
            tma_load(v_desc, [row, 0], v_ready.index(st), v_smem.index(st))
        it += n_blocks
        tc += 1


@gluon.jit
def _fa3_consumer(o_desc, LSE, DELTA, DO, DO16, DO_SCALE, q_smem, o_smem, do_smem, k_smem, v_smem, q_bars, q_empty,
                  k_ready, v_ready, k_empty, v_empty, turn_bars, qk_scale, S, NUM_M, TILES, CID: gl.constexpr,
                  W: gl.constexpr,
                  M_C: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                  STAGES: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, PERSISTENT: gl.constexpr,
                  WITH_DELTA: gl.constexpr, DELTA_O: gl.constexpr, DO_CAST: gl.constexpr):
    """One consumer partition (W warps, M_C query rows of each tile from row CID * M_C): the online softmax over key
    blocks n-1 .. 0, S_i's wgmma issued before P_{i-1} V_{i-1}'s and waited alone (FA3's intra-warp-group
    overlap); o through o_smem (PERSISTENT: its own buffer, the store left in flight into the next tile; else the
    Q tile's buffer) by TMA. WITH_DELTA: once block i's softmax is done and P_{i-1} V_{i-1} retired, dP_i =
    dO V_i^T (V_i's stage, waited for then; outside the GEMM token) and dsum = dsum alpha + rowsum(p dP_i) with the
    fp32 p of block i; delta = dsum / l by pointer store, as LSE. DELTA_O: delta = rowsum(dO o o) in the epilogue
    from the unrounded fp32 o, dO's rows by pointer loads from DO (no dP products, no dO tiles); DO_CAST: DO is
    the upstream gradient in another dtype, its rows written to DO16 as q's dtype of dO * DO_SCALE[0] and delta taken
    from those (the fp16 working copy of dO made here, not by a copy kernel). o is written in o_desc's dtype."""
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1],
                                                    instr_shape=[16, BLOCK_N, 16])
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1],
                                                    instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, mma_s)
    row_o: gl.constexpr = gl.SliceLayout(1, mma_o)
    dtype: gl.constexpr = q_smem.dtype
    q_tile = q_smem.index(CID)
    o_tile = o_smem.index(CID)
    do_tile = do_smem.index(CID)
    zero_s = gl.zeros([M_C, BLOCK_N], gl.float32, mma_s)
    it = 0  # key blocks consumed so far (all tiles); the GEMM token's step count is it + tc
    tc = 0  # tiles so far
    for u in range(0, _my_tiles(TILES, CAUSAL and PERSISTENT)):
        q_pos0, q_row0, kv_row0, n_blocks = _tile(u, S, NUM_M, CID, M_C, BLOCK_M, BLOCK_N, CAUSAL,
                                                  CAUSAL and PERSISTENT)
        acc = gl.zeros([M_C, HEAD_D], gl.float32, mma_o)
        mbarrier.wait(q_bars.index(CID), tc & 1)  # (WITH_DELTA: Q and dO)

        # prologue: key block n-1 (the diagonal one when causal: the only masked block)
        st = it % STAGES
        _token_wait(turn_bars, CID, it + tc, PINGPONG)
        mbarrier.wait(k_ready.index(st), (it // STAGES) & 1)
        s = warpgroup_mma(q_tile, k_smem.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        _token_pass(turn_bars, CID, PINGPONG)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        mbarrier.arrive(k_empty.index(st), count=1)
        if CAUSAL:
            q_pos = q_pos0 + gl.arange(0, M_C, layout=row_s)
            k_pos = (n_blocks - 1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_s))
            s = gl.where(gl.expand_dims(k_pos, 0) <= gl.expand_dims(q_pos, 1), s, float("-inf"))
        m = gl.max(s, axis=1) * qk_scale
        p = gl.exp2(s * qk_scale - gl.expand_dims(m, 1))
        l = gl.sum(p, axis=1)
        if WITH_DELTA:  # dP of block n-1 (its V stage) and dsum = rowsum(p dP) with the fp32 p
            mbarrier.wait(v_ready.index(st), (it // STAGES) & 1)
            dsum = _p_dp_rowsum(p, do_tile, v_smem.index(st), M_C, BLOCK_N, W)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        alpha = gl.full([M_C], 1.0, gl.float32, row_s)

        for i in range(1, n_blocks):
            j = it + i
            st = j % STAGES
            prev = (j - 1) % STAGES
            _token_wait(turn_bars, CID, j + tc, PINGPONG)
            mbarrier.wait(k_ready.index(st), (j // STAGES) & 1)
            s = warpgroup_mma(q_tile, k_smem.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
            acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            _token_pass(turn_bars, CID, PINGPONG)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
            mbarrier.arrive(k_empty.index(st), count=1)
            m_new = gl.maximum(m, gl.max(s, axis=1) * qk_scale)
            alpha = gl.exp2(m - m_new)
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
            l = l * alpha + gl.sum(p, axis=1)
            m = m_new
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
            mbarrier.arrive(v_empty.index(prev), count=1)
            if WITH_DELTA:  # P_{i-1} V_{i-1} retired (p_op's registers free): dP_i on V_i's stage
                mbarrier.wait(v_ready.index(st), (j // STAGES) & 1)
                dsum = dsum * alpha + _p_dp_rowsum(p, do_tile, v_smem.index(st), M_C, BLOCK_N, W)
            p_op = gl.convert_layout(p.to(dtype), p_layout)

        # epilogue: the last block's P V, then o = acc / l by TMA, lse2 = m + log2(l)
        j = it + n_blocks - 1
        last = j % STAGES
        _token_wait(turn_bars, CID, j + 1 + tc, PINGPONG)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        mbarrier.wait(v_ready.index(last), (j // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        _token_pass(turn_bars, CID, PINGPONG)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        mbarrier.arrive(v_empty.index(last), count=1)
        if PERSISTENT:  # the Q tile is free for the next tile's; the previous tile's o store must have left o_tile
            mbarrier.arrive(q_empty.index(CID), count=1)
            tma.store_wait(0)
        o = acc / gl.expand_dims(gl.convert_layout(l, row_o), 1)
        gl.store(LSE + q_row0 + gl.arange(0, M_C, layout=row_s), m + gl.log2(l))
        if WITH_DELTA:
            gl.store(DELTA + q_row0 + gl.arange(0, M_C, layout=row_s), dsum / l)
        if DELTA_O:
            r_o = q_row0 + gl.arange(0, M_C, layout=row_o)
            c_o = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, mma_o))
            offs = gl.expand_dims(r_o.to(gl.int64) * HEAD_D, 1) + gl.expand_dims(c_o, 0)
            do_rows = gl.load(DO + offs)
            if DO_CAST:
                do_rows = (do_rows.to(gl.float32) * gl.load(DO_SCALE)).to(dtype)
                gl.store(DO16 + offs, do_rows)
            gl.store(DELTA + r_o, gl.sum(o * do_rows.to(gl.float32), axis=1))
        o_tile.store(o.to(o_desc.dtype))
        fence_async_shared()
        tma_store(o_desc, [q_row0, 0], o_tile)
        if not PERSISTENT:  # o_tile is the Q tile's buffer: free once the store has read it
            tma.store_wait(0)
            mbarrier.arrive(q_empty.index(CID), count=1)
        it += n_blocks
        tc += 1
    tma.store_wait(0)


@gluon.jit
def _fa3_consumer1(o_desc, LSE, DELTA, DO, DO16, DO_SCALE, q_smem, o_smem, do_smem, k_smem, v_smem, q_bars, q_empty,
                   k_ready, v_ready, k_empty, v_empty, turn_bars, qk_scale, S, NUM_M, TILES, M_C: gl.constexpr,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                   CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, PERSISTENT: gl.constexpr, WITH_DELTA: gl.constexpr,
                   DELTA_O: gl.constexpr, DO_CAST: gl.constexpr):
    """The second ping-pong consumer (a 4-warp worker partition): rows M_C .. 2 M_C - 1 of each tile."""
    _fa3_consumer(o_desc, LSE, DELTA, DO, DO16, DO_SCALE, q_smem, o_smem, do_smem, k_smem, v_smem, q_bars, q_empty,
                  k_ready, v_ready, k_empty, v_empty, turn_bars, qk_scale, S, NUM_M, TILES, 1, 4, M_C, BLOCK_M,
                  BLOCK_N, HEAD_D, STAGES, CAUSAL, PINGPONG, PERSISTENT, WITH_DELTA, DELTA_O, DO_CAST)


@gluon.jit
def _fa3_fwd_kernel(q_desc, k_desc, v_desc, o_desc, LSE, do_desc, DELTA, DO, DO16, DO_SCALE, qk_scale, S, NUM_M,
                    TILES,
                    HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                    CONSUMERS: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                    PERSISTENT: gl.constexpr, WITH_DELTA: gl.constexpr, DELTA_O: gl.constexpr,
                    DO_CAST: gl.constexpr, LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr, num_warps: gl.constexpr):
    """Programs loop over tiles t = program_id, + num_programs, ... < TILES (= NUM_M x B*H; one tile a program
    unless PERSISTENT); see the module docstring. The descriptors view q, k, v, o (and dO) as [B*H*S, D] matrices
    (row bh * S + s); q_desc / o_desc / do_desc blocks are one consumer's M_C = BLOCK_M / CONSUMERS rows.
    WITH_DELTA: do_desc and DELTA ([B*H*S] fp32) are read and written (else q_desc and LSE stand in, unused);
    DELTA_O: DO (dO's [B*H*S, D] storage) and DELTA (else LSE stands in for both, unused); DO_CAST: DO16 (dO's
    copy in q's dtype, times DO_SCALE[0], an fp32 read on the device) written (else LSE stands in, unused).
    o_desc's dtype may differ from q's (PERSISTENT: o has its own buffer)."""
    M_C: gl.constexpr = BLOCK_M // CONSUMERS
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, M_C, HEAD_D], q_desc.layout)
    if PERSISTENT:
        o_smem = gl.allocate_shared_memory(o_desc.dtype, [CONSUMERS, M_C, HEAD_D], o_desc.layout)
    else:
        o_smem = q_smem
    if WITH_DELTA:
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [CONSUMERS, M_C, HEAD_D], do_desc.layout)
    else:
        do_smem = q_smem  # not read
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(CONSUMERS):
        mbarrier.init(q_bars.index(c), count=1)
        mbarrier.init(q_empty.index(c), count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(st), count=1)
        mbarrier.init(v_ready.index(st), count=1)
        mbarrier.init(k_empty.index(st), count=CONSUMERS)
        mbarrier.init(v_empty.index(st), count=CONSUMERS)
    for tb in gl.static_range(2):
        mbarrier.init(turn_bars.index(tb), count=1)

    if CONSUMERS == 1:
        gl.warp_specialize([
            (_fa3_consumer, (o_desc, LSE, DELTA, DO, DO16, DO_SCALE, q_smem, o_smem, do_smem, k_smem, v_smem, q_bars,
                             q_empty, k_ready, v_ready, k_empty, v_empty, turn_bars, qk_scale, S, NUM_M, TILES, 0,
                             num_warps, M_C, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CAUSAL, False, PERSISTENT, WITH_DELTA,
                             DELTA_O, DO_CAST)),
            (_fa3_loader, (q_desc, k_desc, v_desc, do_desc, q_smem, k_smem, v_smem, do_smem, q_bars, q_empty,
                           k_ready, v_ready, k_empty, v_empty, S, NUM_M, TILES, M_C, BLOCK_M, BLOCK_N, STAGES,
                           CONSUMERS, CAUSAL, PERSISTENT, WITH_DELTA)),
        ], [1], [LOAD_REGS])
    else:
        gl.warp_specialize([
            (_fa3_consumer, (o_desc, LSE, DELTA, DO, DO16, DO_SCALE, q_smem, o_smem, do_smem, k_smem, v_smem, q_bars,
                             q_empty, k_ready, v_ready, k_empty, v_empty, turn_bars, qk_scale, S, NUM_M, TILES, 0,
                             num_warps, M_C, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CAUSAL, PINGPONG, PERSISTENT,
                             WITH_DELTA, DELTA_O, DO_CAST)),
            (_fa3_loader, (q_desc, k_desc, v_desc, do_desc, q_smem, k_smem, v_smem, do_smem, q_bars, q_empty,
                           k_ready, v_ready, k_empty, v_empty, S, NUM_M, TILES, M_C, BLOCK_M, BLOCK_N, STAGES,
                           CONSUMERS, CAUSAL, PERSISTENT, WITH_DELTA)),
            (_fa3_consumer1, (o_desc, LSE, DELTA, DO, DO16, DO_SCALE, q_smem, o_smem, do_smem, k_smem, v_smem,
                              q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, turn_bars, qk_scale, S, NUM_M,
                              TILES, M_C, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CAUSAL, PINGPONG, PERSISTENT, WITH_DELTA,
                              DELTA_O, DO_CAST)),
        ], [1, 4], [LOAD_REGS, MMA_REGS])


# ---- variants (benchmarks/sweep_attention_gluon.py measures them; tests compile them for sm_90) ----------------
# name -> attention_fwd_gluon knobs; causal_ok: the variants that take a causal mask (block_n == block_m; persistent
# ones run causal as pairs of a head's query tiles)
VARIANTS = {
    "coop 128x128 s2": dict(),
    "coop 128x128 s3": dict(stages=3),
    "coop 128x64 s4": dict(block_n=64, stages=4),
    "coop 128x128 s2 persistent": dict(persistent=True),
    "pingpong 128x128 s2": dict(consumers=2),
    "pingpong 128x128 s3": dict(consumers=2, stages=3),
    "pingpong 128x64 s4": dict(consumers=2, block_n=64, stages=4),
    "pingpong 128x128 s2 persistent": dict(consumers=2, persistent=True),
    "2 consumers no token 128x128 s2": dict(consumers=2, pingpong=False),
}


def causal_ok(knobs: dict) -> bool:
    """Whether a variant takes a causal mask: one diagonal key block (block_n == block_m)."""
    return knobs.get("block_n", 128) == knobs.get("block_m", 128)


def delta_ok(knobs: dict, head_dim: int = 128) -> bool:
    """Whether a variant fits the shared memory with the do= option's dO tiles (block_m x D more): at D 128 not
    the 3-stage 128 x 128 ones."""
    return fa3_smem_bytes(head_dim, knobs.get("block_m", 128), knobs.get("block_n", 128), knobs.get("stages", 2),
                          knobs.get("persistent", False), True) <= HOPPER_SMEM


# ---- launcher ---------------------------------------------------------------------------------------------------
GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
HOPPER_SMEM = 232448  # bytes of shared memory a block may use on sm_90


def fa3_smem_bytes(head_dim: int, block_m: int, block_n: int, stages: int, persistent: bool,
                   with_delta: bool = False) -> int:
    """Shared memory of one variant (2-byte elements): the Q tiles, PERSISTENT's o tiles, WITH_DELTA's dO tiles,
    the K and V ring, and 1 KB for the barriers."""
    tiles = 1 + int(bool(persistent)) + int(bool(with_delta))
    return 2 * (tiles * block_m * head_dim + 2 * stages * block_n * head_dim) + 1024


def fa3_launch_config(head_dim: int, block_m: int = 128, block_n: int = 128, stages: int = 2, consumers: int = 1,
                      pingpong: bool = True, persistent: bool = False, maxnreg: int | None = None,
                      with_delta: bool = False, delta_o: bool = False, do_cast: bool = False) -> dict:
    """The kernel's constexprs and launch options of one variant (num_warps, maxnreg); ValueError where the
    variant is not one this kernel has: wgmma's 64-row warp groups, the ring (and PERSISTENT's own o buffer,
    with_delta's dO tiles) within the 227 KB of shared memory a block may use. delta_o: delta = rowsum(dO o o) in
    the epilogue instead (not with with_delta: one or the other); do_cast: with delta_o, dO read in another dtype
    and its copy in q's dtype written (DO_CAST)."""
    if with_delta and delta_o:
        raise ValueError("attention_fwd_gluon: delta from dP (with_delta) or from o (delta_o), not both")
    if do_cast and not delta_o:
        raise ValueError("attention_fwd_gluon: do16_out needs delta_from='o' (the epilogue's dO rows)")
    if head_dim not in (64, 128):
        raise ValueError(f"attention_fwd_gluon: head dim {head_dim} is not 64 or 128")
    if consumers not in (1, 2):
        raise ValueError(f"attention_fwd_gluon: consumers must be 1 (cooperative) or 2 (ping-pong), not {consumers}")
    if block_m % consumers or block_m // consumers not in (64, 128):
        raise ValueError(f"attention_fwd_gluon: {block_m} query rows over {consumers} consumer(s) is not 64 or 128 "
                         "rows a consumer")
    m_c = block_m // consumers
    if consumers == 2 and m_c != 64:
        raise ValueError("attention_fwd_gluon: ping-pong consumers are one warp group (64 rows) each: block_m 128")
    if block_n not in (64, 128) or stages < 1:
        raise ValueError(f"attention_fwd_gluon: block_n must be 64 or 128 and stages >= 1 (got {block_n}, {stages})")
    smem = fa3_smem_bytes(head_dim, block_m, block_n, stages, persistent, with_delta)
    if smem > HOPPER_SMEM:
        raise ValueError(f"attention_fwd_gluon: {smem} bytes of shared memory at {block_m}x{block_n}x{stages} stages"
                         + (" persistent" if persistent else "") + (" with delta" if with_delta else ""))
    num_warps = m_c // 16 if consumers == 1 else 4
    total_warps = num_warps + 4 + (4 if consumers == 2 else 0)  # the 1-warp producer takes a warp group's slot
    if maxnreg is None:  # the most that 1 program an SM can have (168 at 12 warps: consumers 240, producer 24)
        maxnreg = min(240, (65536 // (32 * total_warps)) // 8 * 8)
    mma_regs = min(240, ((maxnreg * total_warps - 24 * 4) // (total_warps - 4)) // 8 * 8)
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CONSUMERS=consumers,
                PINGPONG=bool(pingpong) and consumers == 2, PERSISTENT=bool(persistent),
                WITH_DELTA=bool(with_delta), DELTA_O=bool(delta_o), DO_CAST=bool(do_cast), LOAD_REGS=24,
                MMA_REGS=mma_regs, num_warps=num_warps, maxnreg=maxnreg)


def attention_fwd_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        sm_scale: float | None = None, block_m: int = 128, block_n: int = 128, stages: int = 2,
                        consumers: int = 1, pingpong: bool = True, persistent: bool = False,
                        maxnreg: int | None = None, out: tuple[torch.Tensor, ...] | None = None,
                        do: torch.Tensor | None = None, delta_from: str = "dp", o_dtype: torch.dtype | None = None,
                        do16_out: torch.Tensor | None = None, do_scale: float | torch.Tensor = 1.0
                        ) -> tuple[torch.Tensor, ...]:
    """(o [B, H, S, D] in q's dtype, lse2 [B, H, S] fp32 base 2) of softmax(q k^T * scale) v, scale 1/sqrt(D) by
    default; causal top-left aligned. Dense [B, H, S, D] bf16/fp16 CUDA tensors of one shape, D 64 or 128, S a
    multiple of block_m and block_n (causal: block_n == block_m); else ValueError. Knobs (see the module
    docstring): block_m, block_n, stages, consumers (1 cooperative, 2 two partitions), pingpong (the GEMM token
    between 2 consumers), persistent (one program an SM looping over the tiles; causal: over pairs of a head's
    query tiles, S / block_m even), maxnreg. out: (o, lse) (with do: (o, lse, delta)) to write into (contiguous,
    of the shapes and dtypes returned), e.g. NaN-poisoned by a check.
    do (an upstream gradient of o's shape and dtype, known at forward time): returns (o, lse2, delta) with
    delta [B, H, S] fp32 = sum_j P_ij dP_ij, P the normalised softmax in fp32 (before P's rounding for P V) and
    dP = dO V^T (fp32 products of the bf16/fp16 inputs, no scale): seeds/attention.py's
    attention_fwd_with_delta(precise=True) convention, the delta attention_bwd(delta=, split_ds=True) takes.
    One more wgmma a key block (dO V_i^T on V_i's stage) and the dO tiles in shared memory (block_m x D more: the
    3-stage 128 x 128 variants do not fit, delta_ok); measured on the H200.
    delta_from="o" (with do): delta = rowsum(dO o o) with the unrounded fp32 o, in the epilogue (dO's rows by
    pointer loads; no dP product, no dO tiles): seeds/attention_gluon_train.py's fp16 working copies.
    o_dtype: o's dtype (bf16 or fp16; q's by default; another than q's needs persistent, o's own buffer).
    do16_out (with delta_from="o"; do then bf16 or fp16): a contiguous tensor like q that the epilogue fills with
    q's dtype of do * do_scale, the delta taken from those values: the working copy of dO made by the forward,
    which reads dO's rows anyway (seeds/attention_gluon_train.py). do_scale: a float, or a 1-element fp32 tensor
    on q's device that the kernel reads when it runs (so the launch need not wait for a value the GPU computes)."""
    if delta_from not in ("dp", "o"):
        raise ValueError(f"attention_fwd_gluon: delta_from is 'dp' or 'o', not {delta_from!r}")
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"attention_fwd_gluon: q, k, v must be [B, H, S, D] of one shape, not {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.dtype not in GL_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"attention_fwd_gluon: bf16 or fp16 inputs of one dtype, not {q.dtype}, {k.dtype}, {v.dtype}")
    with_delta = do is not None
    do_cast = do16_out is not None
    o_dtype = q.dtype if o_dtype is None else o_dtype
    if o_dtype not in GL_DTYPES or (o_dtype != q.dtype and not persistent):
        raise ValueError(f"attention_fwd_gluon: o_dtype {o_dtype} is bf16 or fp16, and q's ({q.dtype}) unless "
                         "persistent")
    if do_cast and (not with_delta or delta_from != "o" or do.shape != q.shape or do.dtype not in GL_DTYPES
                    or do16_out.shape != q.shape or do16_out.dtype != q.dtype or not do16_out.is_contiguous()):
        raise ValueError("attention_fwd_gluon: do16_out takes do= (bf16 or fp16, q's shape) with delta_from='o', "
                         "and is a contiguous tensor like q")
    if with_delta and not do_cast and (do.shape != q.shape or do.dtype != q.dtype):
        raise ValueError(f"attention_fwd_gluon: do must be like q ({tuple(q.shape)} {q.dtype}), not "
                         f"{tuple(do.shape)} {do.dtype}")
    if out is not None and len(out) != 2 + int(with_delta):
        raise ValueError("attention_fwd_gluon: out must be (o, lse), or (o, lse, delta) with do")
    b, h, s, d = q.shape
    delta_o = with_delta and delta_from == "o"
    cfg = fa3_launch_config(d, block_m, block_n, stages, consumers, pingpong, persistent, maxnreg,
                            with_delta and not delta_o, delta_o, do_cast)
    if s % block_m or s % block_n:
        raise ValueError(f"attention_fwd_gluon: S = {s} is not a multiple of block_m {block_m} and block_n {block_n}")
    if causal and block_n != block_m:
        raise ValueError("attention_fwd_gluon: causal needs block_n == block_m (one diagonal key block)")
    if causal and persistent and (s // block_m) % 2:
        raise ValueError("attention_fwd_gluon: persistent causal runs pairs of query tiles: S / block_m must be even")
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    if not scale > 0:  # the row max is taken before scaling (max(s) c = max(s c) needs c > 0)
        raise ValueError(f"attention_fwd_gluon: sm_scale must be positive, not {scale}")
    if not (q.is_cuda and k.is_cuda and v.is_cuda and (do is None or do.is_cuda)):
        raise ValueError("attention_fwd_gluon: Gluon kernels run on CUDA devices only (no CPU interpreter)")
    q2, k2, v2 = (t.contiguous().view(b * h * s, d) for t in (q, k, v))
    if out is None:
        o = torch.empty((b, h, s, d), dtype=o_dtype, device=q.device)
        lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
        delta = torch.empty((b, h, s), dtype=torch.float32, device=q.device) if with_delta else lse
    else:
        o, lse = out[0], out[1]
        delta = out[2] if with_delta else lse
        if (o.shape != q.shape or o.dtype != o_dtype or not o.is_contiguous()
                or any(t.shape != q.shape[:3] or t.dtype != torch.float32 or not t.is_contiguous()
                       for t in (lse, delta))):
            raise ValueError("attention_fwd_gluon: out must be (o of q's shape in o_dtype, lse [B, H, S] fp32[, delta "
                             "like lse]), all contiguous")
    m_c = block_m // consumers
    gdt = GL_DTYPES[q.dtype]
    q_layout = gl.NVMMASharedLayout.get_default_for([m_c, d], gdt)
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, d], gdt)
    rows = b * h * s
    q_desc = GluonTensorDescriptor(q2, [rows, d], [d, 1], [m_c, d], q_layout)
    o_layout = gl.NVMMASharedLayout.get_default_for([m_c, d], GL_DTYPES[o_dtype])
    o_desc = GluonTensorDescriptor(o.view(rows, d), [rows, d], [d, 1], [m_c, d], o_layout)
    k_desc = GluonTensorDescriptor(k2, [rows, d], [d, 1], [block_n, d], kv_layout)
    v_desc = GluonTensorDescriptor(v2, [rows, d], [d, 1], [block_n, d], kv_layout)
    # dO's [rows, D] view is addressed with Q's row coordinates (same shape, contiguous); unused without do
    do_desc = (GluonTensorDescriptor(do.contiguous().view(rows, d), [rows, d], [d, 1], [m_c, d], q_layout)
               if with_delta and not delta_o else q_desc)
    do_rows = do.contiguous() if delta_o else lse
    num_m = s // block_m
    tiles = num_m * b * h
    grid = (min(tiles // 2 if causal else tiles, sm_count(q.device)) if persistent else tiles,)
    do16, do_scale_t = lse, lse  # unused without do16_out
    if do_cast:
        do16 = do16_out
        do_scale_t = (do_scale if isinstance(do_scale, torch.Tensor) else
                      torch.full((1,), float(do_scale), dtype=torch.float32, device=q.device))
        if do_scale_t.dtype != torch.float32 or do_scale_t.numel() != 1 or do_scale_t.device != q.device:
            raise ValueError("attention_fwd_gluon: do_scale is a float or a 1-element fp32 tensor on q's device")
    _fa3_fwd_kernel[grid](q_desc, k_desc, v_desc, o_desc, lse, do_desc, delta, do_rows, do16, do_scale_t,
                          scale * LOG2E, s, num_m, tiles, HEAD_D=d, CAUSAL=bool(causal), **cfg)
    return (o, lse, delta) if with_delta else (o, lse)
