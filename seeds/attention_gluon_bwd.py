"""Attention backward for Hopper (sm_90) in Gluon (triton.experimental.gluon), in the FlashAttention-3 style.
Measured on the H200 (B4 H32 S4096 D128): with the split dS 8.356 ms non-causal
(328.9 TFLOP/s counting 5 products; cuDNN 5.340) and 4.461 ms causal (cuDNN 2.996), against 9.313 / 4.937 for
seeds/attention.py's Triton backward; dS rounded once 6.406 / 3.489 ms (bf16; the fp16 working copies of
seeds/attention_gluon_train.py 6.470 / 3.458). Every variant within its float64 check.

What: (dq, dk, dv) of o = softmax(q k^T * scale) v for an upstream gradient do, from the forward's base-2
log-sum-exp lse2 [B, H, S] fp32 and delta [B, H, S] fp32, the contract of seeds/attention.py's attention_bwd:
    s = q k^T,  P = exp2(s * scale * log2(e) - lse2),  dV = P^T dO,  dP = dO V^T,
    dS = P o (dP - delta),  dQ = scale dS K,  dK = scale dS^T Q
with delta_i = sum_j P_ij dP_ij (attention_fwd_with_delta(precise=True): the "precise" numerics the harness needs)
or rowsum(dO o O). dS enters the dK and dQ products as two operands of the input dtype
(split_ds=True, the default: hi = dS rounded, lo = (dS - hi) rounded, seeds/attention.py's _ds_product SPLIT_DS 1)
or rounded once (split_ds=False); P enters dV's product rounded once, as in FlashAttention.
Shapes: dense do, q, k, v [B, H, S, D], one shape (MHA: no GQA, no varlen), bf16 or fp16, D 64 or 128, S a
multiple of every block size, scale > 0; the launcher raises ValueError on anything else. Causal masks are
top-left aligned (key j seen by query i when j <= i). CUDA sm_90 only: Gluon does not run on Triton's CPU
interpreter. Outputs like q (contiguous), written by TMA stores; no atomics, so the result is bitwise repeatable.
FLOPs: the backward's 5 products are 2.5x the forward's 4 B H S^2 D (10 B H S^2 D; half when causal): 2.75 TFLOP at
B4 H32 S4096 D128 (the forward 1.10 TFLOP: 4 x 128 x 4096^2 x 128; the "275 GFLOP" in seeds/attention.py's and
attention_gluon.py's docstrings is 4x short, their TFLOP/s figures are right). Executed: 9 products of 2 S^2 D a
head with the split dS (dK/dV: S^T, dP^T, dV, dK hi, dK lo; dQ: S, dP, dQ hi, dQ lo), 4.95 TFLOP, 7 without it;
the sweeps count 10 B H S^2 D whatever the variant executes.

The schedule: two kernels, each one program a (block, batch x head) tile, tiles head by head (the programs running
at once share a few heads' inputs in L2), each gl.warp_specialize'd into a 1-warp TMA producer partition
(setmaxnreg 24) and an 8-warp consumer (240 registers; two 64-row warp groups, wgmma layout [8, 1], in one
instruction stream, as the forward's cooperative consumer), 12 warps at 168 registers a thread, one program an SM.
- dK / dV (_dkdv_kernel, FA3's layout): the program keeps BLOCK_N = 128 keys. The producer loads its K and V once,
  then streams the query blocks' Q and dO tiles (BLOCK_M = 64 rows) through a STAGES-deep ring (per slot a Q
  "ready" mbarrier, a dO "ready" one, one "empty"), and each block's lse2 and delta by pointer loads into shared
  memory (the dO barrier's second arrival): read straight into S^T's column layout they would hold 32 registers a
  thread across the step, and made the consumer spill. Per query block the consumer (keys on rows, so dK and dV
  accumulate as plain A-from-registers wgmma) issues S^T = K Q^T and dP^T = V dO^T (both operands in shared
  memory), waits for S^T alone (warpgroup_mma_wait(1)), computes P^T = exp2(S^T c - lse2) while dP^T is on the
  tensor cores, issues dV += P^T dO, waits for dP^T alone, computes dS^T = P^T (dP^T - delta) while dV's product
  runs, issues dK += hi^T Q (and lo^T Q), retires everything (wait(0)) and hands the slot back. Causal: query
  blocks from the key block's diagonal on; the first BLOCK_N / BLOCK_M cross it (a peeled loop with the mask,
  run with wait(0) between the products: the mask's positions made the overlapped step spill), the rest unmasked.
  Epilogue: dK * scale and dV through K's and V's buffers, TMA stores.
- dQ (_dq_kernel, the forward's structure): the program keeps BLOCK_M = 128 queries (Q and dO tiles loaded once,
  its lse2 / delta rows in registers: 2 a thread in the row layout); the producer streams K and V blocks (BLOCK_N
  64 or 128 rows) through the ring with their own ready / empty barriers. Per key block: S = Q K^T and dP = dO V^T
  issued, P while dP runs (wait(1)), V's slot handed back, dS = P (dP - delta), dQ += hi K (+ lo K), K's slot
  handed back once they retire. Causal: key blocks 0 .. diagonal, a head's longest query blocks first; the last
  BLOCK_M / BLOCK_N blocks masked (a peeled loop). Epilogue: dQ * scale through Q's buffer, TMA store.
Why a separate dQ kernel and not FA3's atomics: it is deterministic (the harness's checks repeat calls; bitwise
repeatable results are the primary variant), it needs no fp32 dQ scratch (B H S D x 4 bytes, 256 MB here) nor a
conversion kernel, and seeds/attention.py's FA2 layout with dQ atomics measured 0.43x. Its cost is the
recompute of S and dP (2 of 7 products with the split dS). An atomic / TMA reduce-add dQ is not implemented.
dq_ordered: the dK/dV kernel computes dQ's share too and the dQ kernel is not launched. Per step dS^T (rounded once)
goes to shared memory, dK += dS^T Q and dQ^T = K^T dS^T are issued from it, and dQ^T is added into an fp32
accumulator in a fixed order per query block, through a ticket per (head, query block): rank 0 stores, rank r > 0
spins (one acquire atomic, gpu scope) until the ticket reads r, adds (loads .cg), then a barrier among the
consumer's warps and the ticket + 1 (release), as FA3's deterministic mode and CUTLASS's generic barrier order
theirs. Fixed order, so bitwise repeatable; dS rounded once only (split_ds=False), D 128. _dq_finish_kernel then
writes dq = acc^T * scale. Cost: 5 products a step instead of 4 + the dQ kernel's 3, 32 KB read + written a step in
L2.
- v1, measured on the H200 (B4 H32 S4096 D128, fp16 working copies, bf16 gradients): correct (dq, dk, dv
  within tolerance of float64, dq bitwise repeatable) but slow: fwd+bwd 12.42 ms against 9.08 with the dQ kernel
  (non-causal), 7.60 against 5.15 causal; the backward alone ~9.7 ms against ~6.4. Every key block walked the query
  blocks last to first, so a head's N programs wanted the same block's ticket at once and queued (rank = key block
  index); and the accumulator was [B*H*S, D] row-major while the wgmma layout's threads hold pairs of consecutive
  columns of dQ^T [D, BLOCK_M] (queries), 512 bytes apart there: one 32-byte sector an element, 8x the traffic.
- v2 (this code: correct on 8 GPU configurations, no hang at 64 key blocks a head, but still slower than
  the dQ kernel: `crucible bench` deferred 11.21 ms non-causal, 6.03 causal, against 8.54 / 4.88 for the seed;
  the seed does not take it). Rotated order: with c = BLOCK_N / BLOCK_M (2), M = S / BLOCK_M query
  blocks and N = S / BLOCK_N key blocks (M = c N), key block n at step i takes query block m = (c n + i) mod M
  (non-causal, i = 0 .. M-1; causal: m = c n + i, i = 0 .. M-1-c n, from its diagonal on, the first c steps the
  diagonal's masked ones as in the plain path). Algebra: write m = c a + b (0 <= b < c). Non-causal, the step at
  which n meets m is i = (m - c n) mod M = c ((a - n) mod N) + b, distinct for distinct n, and i // c = (a - n)
  mod N: the ranks 0 .. N-1, each once, rank 0 key block a. Causal, n meets m where c n <= m, i.e. n <= a, at
  i = m - c n = c (a - n) + b: i // c = a - n, the ranks 0 .. a, rank 0 the diagonal's key block a. So a program's
  rank at its step i is i // c in both modes, and rank r's predecessor (rank r - 1: n' = n + 1 mod N) met the
  block at its own step i - c: in steady state the programs advance together and it released c steps ago; no
  two programs of a head want one block at one step. The loader streams Q / dO in the same order
  (_dq_ordered_block). Transposed accumulator: [B*H, D, S] fp32 (dQ^T a head), so a quad's 8 consecutive columns
  are one whole 32-byte sector; _dq_finish_kernel transposes it back (Triton, a [64, D] tile a program).
  dq_defer (the default; DQ_DEFER): the share goes to a 32 KB fp32 shared buffer instead and is added by the next
  step once its S^T and dP^T are issued (the ticket wait and the L2 round trip under their tensor-core time; the
  causal masked steps add at once; the last step's after the loop), read back in 32-row chunks of 16-byte
  vectors, one chunk's L2 round trip after the other (a register-held share instead spilled 300-340 bytes).
  Deadlock: the waits form (n, i) -> (n + 1 mod N, i - c), the step strictly decreasing, so among a head's programs
  all resident the one blocked at the least step waits on one that is not blocked: the head finishes. The wrap
  (non-causal: N-1 waits on 0) and causal's n -> n + 1 (a later program) make this need all N of a head resident
  at once (v1's n -> n - 1 only needed in-order starts): the grid is head-major with n fastest and a head only
  waits on itself, so if CTAs start in grid order (as the hardware dispatches; CUDA does not promise it) and
  N <= the SMs (one CTA an SM: the launcher raises ValueError otherwise, check_co_resident), the lowest unfinished
  head's programs are all started (fewer than N resident CTAs precede its last one, so an SM is free for it) and
  it finishes, then the next: by induction every head does. Not covered: other kernels holding SMs while this one
  runs (MPS, concurrent streams) could leave fewer than N SMs to a head.
  Stack (tests/test_attention_gluon_bwd.py's compile check, bound ORDERED_SPILL_BOUND): triton 3.6 0 bytes
  non-causal / 0 causal, deferred 0 / 0; 3.9 8 / 0, deferred 8 / 8 (v1: 0 / 136 and 8 / 152; the counts move by
  tens of bytes with small changes of the code); 168 registers at launch; shared memory 181.5 KB at 2 stages with
  bf16 outputs (214.3 KB deferred); ptxas (3.6) reports no serialised wgmma.
Knobs (attention_bwd_gluon keywords; VARIANTS names the sweep's set): block_m (64; 128), stages (2; the ring
within 227 KB: 4 at 64-row blocks), dq_block_n (64 or 128), dq_stages (2; 3 at 64-row blocks), overlap (True;
False: wait(0) after every issue, the serial control), maxnreg (168), split_ds, and group_heads (0: head by head;
G: causal programs heaviest first across groups of G heads, _group_order), and pdl (the dQ kernel's programs on
the SMs the dK/dV grid's last wave leaves idle). The fwd+bwd seed takes pdl, and causal G = 4: `crucible bench`
4.70-4.72 ms causal against 4.82 without either, 8.48 non-causal against 8.53. The dQ
kernel's causal diagonal blocks take dS as hi + lo whatever split_ds (dS rounded once lost dq's few-key
rows, where the dS sum to zero). block_n and dq_block_m are 128
(the two consumer warp groups).
Compiled for sm_90 (tests/test_attention_gluon_bwd.py, triton 3.9 and, by hand, 3.6): every variant at 168
registers a thread at launch (setmaxnreg 240 consumer / 24 producer), no spills (local 0, stack 0), wgmma.wait_group
1 kept where overlap; shared memory: dK/dV 132 KB at 2 stages (199 KB at 4), dQ 131 KB at 2 stages of 64-row blocks
(164 KB at 3, 197 KB at 2 of 128-row blocks). The dK/dV kernel at 3 stages spilled 8 bytes under triton 3.9 (not
3.6), hence 4 in VARIANTS. CPU mirror of the maths in the kernels' order against float64 autograd:
tests/test_attention_gluon_bwd.py.

Compatibility: the TMA copies are tma.async_copy_global_to_shared / async_copy_shared_to_global in triton 3.6 (the
H200's) and tma.async_load / async_store in 3.9, picked by `dir()` as in seeds/attention_gluon.py (crucible's
static checker refuses getattr and try/except).
Not done: ping-pong between two consumer partitions, persistent scheduling (causal pairs), deferring dQ's wait into
the next step (its products retire before the next S is issued).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor

# the TMA copies under their Triton 3.6 or 3.9 names, picked once in the forward's module
from seeds.attention_gluon import LOG2E, tma_load, tma_store

# a barrier among one partition's warps: gl.thread_barrier in triton 3.6, gl.barrier in 3.9 (picked by name)
if "thread_barrier" in dir(gl):
    partition_barrier = gl.thread_barrier
else:
    partition_barrier = gl.barrier


# ---- shared device code -----------------------------------------------------------------------------------------
@gluon.jit
def _ds_operands(ds, op_layout: gl.constexpr, dtype: gl.constexpr, SPLIT_DS: gl.constexpr):
    """dS (fp32, an accumulator layout) as the register A operand(s) of the dK / dQ product: hi = dS rounded to the
    input dtype and, with SPLIT_DS, lo = (dS - hi) rounded (seeds/attention.py's _ds_product, SPLIT_DS 1); without
    it lo is hi (unused)."""
    hi = ds.to(dtype)
    if SPLIT_DS:
        lo = (ds - hi.to(gl.float32)).to(dtype)
        lo_op = gl.convert_layout(lo, op_layout)
    else:
        lo_op = gl.convert_layout(hi, op_layout)
    return gl.convert_layout(hi, op_layout), lo_op


# ---- dK / dV: one program a key block ---------------------------------------------------------------------------
@gluon.jit
def _group_order(t, PER_HEAD, GROUPED: gl.constexpr, GROUP: gl.constexpr):
    """(head, block within the head) of program t: head-major (t // PER_HEAD, t % PER_HEAD), or GROUPED: groups of
    GROUP heads (the last one what is left), block-major within a group, so that a causal grid's heaviest
    programs of every head of a group run before its lighter ones and the grid ends on light programs (the
    tail's idle SMs: a simulation of the B4 H32 S4096 grids gave 3.3% above the ideal makespan head-major, 0.2-0.3%
    grouped by 4 or 8; `crucible bench` with pdl: 4.70-4.72 ms against 4.82 head-major). A group's heads share L2
    as head-major's neighbours do."""
    if GROUPED:
        heads = gl.num_programs(0) // PER_HEAD
        g = t // (GROUP * PER_HEAD)
        r = t % (GROUP * PER_HEAD)
        size = gl.minimum(heads - g * GROUP, GROUP)
        return g * GROUP + r % size, r // size
    else:
        return t // PER_HEAD, t % PER_HEAD


@gluon.jit
def _dkdv_tile_gl(S, NUM_N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, GROUP: gl.constexpr):
    """(row of the [B*H*S, D] view of the program's first key, of its head's first query, the first query block,
    the query-block count). Tiles run head by head, key blocks in order (causal: the heaviest first); causal with
    GROUP > 0: groups of GROUP heads one after the other, within a group key block 0 of each head first, then key
    block 1 of each, ... (heaviest first across the group: _group_order)."""
    bh, n = _group_order(gl.program_id(0), NUM_N, CAUSAL and GROUP > 0, GROUP)
    if CAUSAL:
        m0 = (n * BLOCK_N) // BLOCK_M
    else:
        m0 = 0
    return bh * S + n * BLOCK_N, bh * S, m0, S // BLOCK_M - m0


@gluon.jit
def _dkdv_loader(q_desc, do_desc, k_desc, v_desc, LSE, DELTA, k_smem, v_smem, q_smem, do_smem, lse_smem, dlt_smem,
                 kv_bar, q_ready, do_ready, qdo_empty, S, NUM_N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, CAUSAL: gl.constexpr, ROTATED: gl.constexpr, GROUP: gl.constexpr):
    """The producer (1 warp): the program's K and V once, then per query block Q and dO by TMA and its lse2 and
    delta by pointer loads into shared memory (do_ready's second arrival: the consumers read them in the layout of
    S^T's columns, which would hold 16 registers a thread each if loaded there ahead of use). ROTATED
    (DQ_ORDERED): step i's query block is _dq_ordered_block's."""
    vec: gl.constexpr = gl.BlockedLayout(size_per_thread=[BLOCK_M // 32], threads_per_warp=[32], warps_per_cta=[1],
                                         order=[0])
    offs = gl.arange(0, BLOCK_M, layout=vec)
    k_row, q_row0, m0, n_steps = _dkdv_tile_gl(S, NUM_N, BLOCK_M, BLOCK_N, CAUSAL, GROUP)
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes)
    tma_load(k_desc, [k_row, 0], kv_bar, k_smem)
    tma_load(v_desc, [k_row, 0], kv_bar, v_smem)
    for i in range(n_steps):
        st = i % STAGES
        ph = (i // STAGES) & 1
        if ROTATED:
            row = q_row0 + _dq_ordered_block(i, NUM_N, S, BLOCK_M, BLOCK_N) * BLOCK_M
        else:
            row = q_row0 + (m0 + i) * BLOCK_M
        mbarrier.wait(qdo_empty.index(st), ph ^ 1)
        mbarrier.expect(q_ready.index(st), q_desc.block_type.nbytes)
        tma_load(q_desc, [row, 0], q_ready.index(st), q_smem.index(st))
        mbarrier.expect(do_ready.index(st), do_desc.block_type.nbytes)
        tma_load(do_desc, [row, 0], do_ready.index(st), do_smem.index(st))
        lse_smem.index(st).store(gl.load(LSE + row + offs))
        dlt_smem.index(st).store(gl.load(DELTA + row + offs))
        mbarrier.arrive(do_ready.index(st), count=1)


@gluon.jit
def _dkdv_issue(i, k_smem, v_smem, q_smem, do_smem, q_ready, do_ready, mma_s: gl.constexpr, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """S^T = K Q^T and dP^T = V dO^T of query block i (ring slot i % STAGES) issued, each once its tile landed;
    both left in flight."""
    st = i % STAGES
    ph = (i // STAGES) & 1
    zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma_s)
    mbarrier.wait(q_ready.index(st), ph)
    s = warpgroup_mma(k_smem, q_smem.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    mbarrier.wait(do_ready.index(st), ph)
    dp = warpgroup_mma(v_smem, do_smem.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    return s, dp


@gluon.jit
def _dkdv_softmax(i, offset, s, dp, dv, q_smem, do_smem, lse_smem, dlt_smem, qk_scale, mma_s: gl.constexpr,
                  op_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  MASK: gl.constexpr, OVERLAP: gl.constexpr):
    """The rest of _dkdv_front once S^T and dP^T are issued: P^T = exp2(S^T c - lse2) while dP^T runs (OVERLAP:
    wait_group 1), dV += P^T dO issued (left in flight where OVERLAP), dS^T = P^T (dP^T - delta) while it runs."""
    col_s: gl.constexpr = gl.SliceLayout(0, mma_s)
    dtype: gl.constexpr = q_smem.dtype
    st = i % STAGES
    q_t = q_smem.index(st)
    do_t = do_smem.index(st)
    if OVERLAP:
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
    else:
        s, dp = warpgroup_mma_wait(num_outstanding=0, deps=(s, dp))
    p = gl.exp2(s * qk_scale - gl.expand_dims(lse_smem.index(st).load(col_s), 0))
    if MASK:
        r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma_s))
        c = gl.arange(0, BLOCK_M, layout=col_s) + offset
        p = gl.where(gl.expand_dims(r, 1) <= gl.expand_dims(c, 0), p, 0.0)
    p_op = gl.convert_layout(p.to(dtype), op_layout)
    dv = warpgroup_mma(p_op, do_t, dv, is_async=True)
    if OVERLAP:
        dp = warpgroup_mma_wait(num_outstanding=1, deps=(dp,))
    else:
        dv, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, p_op))
    ds = p * (dp - gl.expand_dims(dlt_smem.index(st).load(col_s), 0))
    return ds, dv, p_op, q_t


@gluon.jit
def _dkdv_front(i, offset, dv, k_smem, v_smem, q_smem, do_smem, lse_smem, dlt_smem, q_ready, do_ready, qk_scale,
                mma_s: gl.constexpr, op_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr, MASK: gl.constexpr, OVERLAP: gl.constexpr):
    """The first half of a dK/dV step, query block i (ring slot i % STAGES): S^T = K Q^T and dP^T = V dO^T issued
    together (_dkdv_issue), P^T = exp2(S^T c - lse2) while dP^T runs (OVERLAP: wait_group 1), dV += P^T dO issued
    (left in flight where OVERLAP), dS^T = P^T (dP^T - delta) while it runs (_dkdv_softmax). MASK: the block
    crosses the diagonal; offset = its first query's position minus the key block's first (key row r, query
    column c kept where r <= c + offset). Returns (dS^T fp32, dv, P^T's operand: a dependency of dV's product, the
    slot's Q tile)."""
    s, dp = _dkdv_issue(i, k_smem, v_smem, q_smem, do_smem, q_ready, do_ready, mma_s, BLOCK_M, BLOCK_N, STAGES)
    return _dkdv_softmax(i, offset, s, dp, dv, q_smem, do_smem, lse_smem, dlt_smem, qk_scale, mma_s, op_layout,
                         BLOCK_M, BLOCK_N, STAGES, MASK, OVERLAP)


@gluon.jit
def _dkdv_step(i, offset, dk, dv, k_smem, v_smem, q_smem, do_smem, lse_smem, dlt_smem, q_ready, do_ready, qdo_empty,
               qk_scale, mma_s: gl.constexpr, op_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               STAGES: gl.constexpr, MASK: gl.constexpr, SPLIT_DS: gl.constexpr, OVERLAP: gl.constexpr):
    """Query block i of the program's (ring slot i % STAGES): _dkdv_front (S^T, dP^T, P^T, dV's product issued,
    dS^T), then dK += dS^T Q (hi, then lo with SPLIT_DS), all retired before the slot is handed back."""
    dtype: gl.constexpr = q_smem.dtype
    st = i % STAGES
    ds, dv, p_op, q_t = _dkdv_front(i, offset, dv, k_smem, v_smem, q_smem, do_smem, lse_smem, dlt_smem, q_ready,
                                    do_ready, qk_scale, mma_s, op_layout, BLOCK_M, BLOCK_N, STAGES, MASK, OVERLAP)
    hi_op, lo_op = _ds_operands(ds, op_layout, dtype, SPLIT_DS)
    dk = warpgroup_mma(hi_op, q_t, dk, is_async=True)
    if SPLIT_DS:
        dk = warpgroup_mma(lo_op, q_t, dk, is_async=True)
    dv, dk, p_op, hi_op, lo_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, p_op, hi_op, lo_op))
    mbarrier.arrive(qdo_empty.index(st), count=1)
    return dk, dv


@gluon.jit
def _dq_ordered_block(i, NUM_N, S, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """DQ_ORDERED's query block at the program's step i: (c n + i) mod M for key block n, c = BLOCK_N / BLOCK_M,
    M = S / BLOCK_M query blocks (causal: c n + i < M, the steps from the key block's diagonal on)."""
    return ((BLOCK_N // BLOCK_M) * (gl.program_id(0) % NUM_N) + i) % (S // BLOCK_M)


@gluon.jit
def _ticket_wait(ticket, rank):
    """Spin until the query block's ticket reads rank (ranks 0 .. rank-1 added; acquire, gpu scope)."""
    while gl.atomic_add(ticket, 0, sem="acquire", scope="gpu") != rank:
        pass


@gluon.jit
def _ticket_release(ticket):
    """A barrier among the partition's warps (every warp's adds issued before it), then the ticket + 1 (release:
    the adds visible to whoever acquires the next value)."""
    partition_barrier()
    gl.atomic_add(ticket, 1, sem="release", scope="gpu")


@gluon.jit
def _dq_ordered_add(dqt, acc_head, ticket, m_blk, rank, S, layout: gl.constexpr, HEAD_D: gl.constexpr,
                    BLOCK_M: gl.constexpr):
    """A key block's share of dQ^T ([HEAD_D, BLOCK_M] fp32 in registers, unscaled, query block m_blk) added into
    the head's columns of the transposed fp32 accumulator (acc_head: [HEAD_D, S], row-major), at its rank in the
    block's fixed order: rank 0 stores; rank r > 0 waits until the block's ticket reads r, then adds; then the
    ticket + 1. The wgmma layout's threads hold pairs of consecutive columns (queries): consecutive addresses
    here, a quad's 8 columns one whole 32-byte sector."""
    d = gl.arange(0, HEAD_D, layout=gl.SliceLayout(1, layout))
    c = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, layout))
    ptrs = acc_head + (gl.expand_dims(d * S, 1) + gl.expand_dims(m_blk * BLOCK_M + c, 0))
    if rank == 0:
        gl.store(ptrs, dqt)
    else:
        _ticket_wait(ticket, rank)
        gl.store(ptrs, gl.load(ptrs, cache_modifier=".cg") + dqt)
    _ticket_release(ticket)


@gluon.jit
def _dq_ordered_add_staged(dqt_smem, acc_head, ticket, m_blk, rank, S, W: gl.constexpr, HEAD_D: gl.constexpr,
                           BLOCK_M: gl.constexpr):
    """_dq_ordered_add from shared memory (DQ_DEFER: dqt_smem [HEAD_D, BLOCK_M] fp32, the previous step's share),
    read in row chunks of 4 W rows in a layout of 16-byte vectors along the queries (a warp's two rows two whole
    256-byte segments), 8 values a thread, so that it takes few registers while S^T and dP^T are in flight (2 W
    rows: 16-40 bytes of stack, 8 W: 48-56, one chunk: 168-208). The compiled code keeps each chunk's loads after
    the previous chunk's stores (it cannot tell them apart), so a rank > 0 add is 4 L2 round trips in a row."""
    CHUNK: gl.constexpr = 4 * W
    blk: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[2, 16], warps_per_cta=[W, 1],
                                         order=[1, 0])
    d = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, blk))
    c = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, blk))
    offs = gl.expand_dims(d * S, 1) + gl.expand_dims(m_blk * BLOCK_M + c, 0)
    partition_barrier()  # every warp's share stored (the previous step, in the wgmma layout)
    if rank == 0:
        for j in gl.static_range(HEAD_D // CHUNK):
            gl.store(acc_head + j * CHUNK * S + offs, dqt_smem.slice(j * CHUNK, CHUNK).load(blk))
    else:
        _ticket_wait(ticket, rank)
        for j in gl.static_range(HEAD_D // CHUNK):
            ptrs = acc_head + j * CHUNK * S + offs
            gl.store(ptrs, gl.load(ptrs, cache_modifier=".cg") + dqt_smem.slice(j * CHUNK, CHUNK).load(blk))
    _ticket_release(ticket)


@gluon.jit
def _dkdv_step_dq(i, i0, m_blk, offset, dk, dv, k_smem, v_smem, q_smem, do_smem, lse_smem, dlt_smem, ds_smem, dqt_smem,
                  q_ready, do_ready, qdo_empty, qk_scale, acc_head, tickets_head, S, W: gl.constexpr,
                  mma_s: gl.constexpr, op_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  HEAD_D: gl.constexpr, STAGES: gl.constexpr, MASK: gl.constexpr, OVERLAP: gl.constexpr,
                  DEFER: gl.constexpr):
    """_dkdv_step with dQ's share computed here (DQ_ORDERED, dS rounded once): dS^T goes to shared memory
    (ds_smem [BLOCK_N, BLOCK_M]), dK += dS^T Q and dQ^T = K^T dS^T are issued from it, and dQ^T is added at rank
    i // c (_dq_ordered_add) once the slot is handed back. DEFER: the share goes to dqt_smem instead and is added
    (_dq_ordered_add_staged) by the next step once its S^T and dP^T are issued, the L2 round trip and any ticket
    wait under their tensor-core time (the last step's: _dkdv_consumer, after the loop); i0: the loop's first step,
    which has none to add. m_blk: the query block (_dq_ordered_block)."""
    dtype: gl.constexpr = q_smem.dtype
    C: gl.constexpr = BLOCK_N // BLOCK_M
    st = i % STAGES
    s, dp = _dkdv_issue(i, k_smem, v_smem, q_smem, do_smem, q_ready, do_ready, mma_s, BLOCK_M, BLOCK_N, STAGES)
    if DEFER:
        if i > i0:  # the previous step's share
            m_prev = (m_blk + S // BLOCK_M - 1) % (S // BLOCK_M)
            _dq_ordered_add_staged(dqt_smem, acc_head, tickets_head + m_prev, m_prev, (i - 1) // C, S, W, HEAD_D,
                                   BLOCK_M)
    ds, dv, p_op, q_t = _dkdv_softmax(i, offset, s, dp, dv, q_smem, do_smem, lse_smem, dlt_smem, qk_scale, mma_s,
                                      op_layout, BLOCK_M, BLOCK_N, STAGES, MASK, OVERLAP)
    ds_smem.store(ds.to(dtype))
    fence_async_shared()
    dk = warpgroup_mma(ds_smem, q_t, dk, is_async=True)
    dqt = warpgroup_mma(k_smem.permute((1, 0)), ds_smem, gl.zeros([HEAD_D, BLOCK_M], gl.float32, mma_s),
                        use_acc=False, is_async=True)
    dv, dk, dqt, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dqt, p_op))
    mbarrier.arrive(qdo_empty.index(st), count=1)
    if DEFER:  # the add above has read the previous share (its release barrier)
        dqt_smem.store(dqt)
    else:
        _dq_ordered_add(dqt, acc_head, tickets_head + m_blk, m_blk, i // C, S, mma_s, HEAD_D, BLOCK_M)
    return dk, dv


@gluon.jit
def _dkdv_consumer(dk_desc, dv_desc, k_smem, v_smem, out_smem, q_smem, do_smem, lse_smem, dlt_smem, kv_bar, q_ready,
                   do_ready, qdo_empty, dk_scale, dv_scale, qk_scale, S, NUM_N, ds_smem, dqt_smem, DQ_ACC,
                   TICKETS, W: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                   STAGES: gl.constexpr, CAUSAL: gl.constexpr, SPLIT_DS: gl.constexpr, OVERLAP: gl.constexpr,
                   OUT_SEPARATE: gl.constexpr, DQ_ORDERED: gl.constexpr, DQ_DEFER: gl.constexpr,
                   GROUP: gl.constexpr):
    """The consumer warp groups (W warps, keys on rows, W / 4 warp groups of 64 keys each): per query block,
    S^T = K Q^T and dP^T = V dO^T issued together, P^T = exp2(S^T c - lse2) while dP^T is on the tensor cores
    (OVERLAP), dV += P^T dO issued, dS^T = P^T (dP^T - delta) while it runs, dK += dS^T Q (two products with
    SPLIT_DS: hi, lo). Epilogue: dK dk_scale and dV dv_scale through K's and V's buffers, TMA stores (OUT_SEPARATE:
    the outputs' dtype is not the inputs', one after the other through out_smem). DQ_ORDERED: the query blocks in
    the rotated order (_dq_ordered_block), dQ's share of each added into DQ_ACC at the program's rank there
    (_dkdv_step_dq; no dQ kernel); DQ_DEFER: each share added during the next step."""
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1],
                                                    instr_shape=[16, BLOCK_M, 16])
    mma_d: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1],
                                                    instr_shape=[16, HEAD_D, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_d, k_width=2)
    dtype: gl.constexpr = q_smem.dtype
    k_row, q_row0, m0, n_steps = _dkdv_tile_gl(S, NUM_N, BLOCK_M, BLOCK_N, CAUSAL, GROUP)
    dk = gl.zeros([BLOCK_N, HEAD_D], gl.float32, mma_d)
    dv = gl.zeros([BLOCK_N, HEAD_D], gl.float32, mma_d)
    mbarrier.wait(kv_bar, 0)
    # causal: the first BLOCK_N / BLOCK_M query blocks cross the diagonal (masked, and serial: the mask's column
    # positions would make the overlapped step spill), the rest are whole
    n_diag = BLOCK_N // BLOCK_M if CAUSAL else 0
    if DQ_ORDERED:  # key block n at step i: query block (c n + i) mod M, rank i // c there
        num_m = S // BLOCK_M
        bh = gl.program_id(0) // NUM_N
        acc_head = DQ_ACC + bh.to(gl.int64) * (HEAD_D * S)
        tickets_head = TICKETS + bh * num_m
        for i in range(0, n_diag):  # causal: the diagonal's blocks first, masked and serial
            m_blk = _dq_ordered_block(i, NUM_N, S, BLOCK_M, BLOCK_N)
            dk, dv = _dkdv_step_dq(i, 0, m_blk, m_blk * BLOCK_M - (k_row - q_row0), dk, dv, k_smem, v_smem, q_smem,
                                   do_smem, lse_smem, dlt_smem, ds_smem, dqt_smem, q_ready, do_ready, qdo_empty,
                                   qk_scale, acc_head, tickets_head, S, W, mma_s, op_layout, BLOCK_M, BLOCK_N, HEAD_D,
                                   STAGES, True, False, False)
        for i in range(n_diag, n_steps):
            dk, dv = _dkdv_step_dq(i, n_diag, _dq_ordered_block(i, NUM_N, S, BLOCK_M, BLOCK_N), 0, dk, dv, k_smem,
                                   v_smem, q_smem, do_smem, lse_smem, dlt_smem, ds_smem, dqt_smem, q_ready, do_ready,
                                   qdo_empty, qk_scale, acc_head, tickets_head, S, W, mma_s, op_layout, BLOCK_M,
                                   BLOCK_N, HEAD_D, STAGES, False, OVERLAP, DQ_DEFER)
        if DQ_DEFER:  # the last step's share, where the loop above ran (causal's last key block: masked only)
            if n_steps > n_diag:
                m_last = _dq_ordered_block(n_steps - 1, NUM_N, S, BLOCK_M, BLOCK_N)
                _dq_ordered_add_staged(dqt_smem, acc_head, tickets_head + m_last, m_last,
                                       (n_steps - 1) // (BLOCK_N // BLOCK_M), S, W, HEAD_D, BLOCK_M)
    for i in range(0, n_diag if not DQ_ORDERED else 0):
        dk, dv = _dkdv_step(i, (m0 + i) * BLOCK_M - (k_row - q_row0), dk, dv, k_smem, v_smem, q_smem, do_smem,
                            lse_smem, dlt_smem, q_ready, do_ready, qdo_empty, qk_scale, mma_s, op_layout, BLOCK_M,
                            BLOCK_N, STAGES, True, SPLIT_DS, False)
    for i in range(n_diag, n_steps if not DQ_ORDERED else 0):
        dk, dv = _dkdv_step(i, 0, dk, dv, k_smem, v_smem, q_smem, do_smem, lse_smem, dlt_smem, q_ready, do_ready,
                            qdo_empty, qk_scale, mma_s, op_layout, BLOCK_M, BLOCK_N, STAGES, False, SPLIT_DS,
                            OVERLAP)
    if OUT_SEPARATE:  # outputs in another dtype (fp16 working copies, bf16 gradients): one tile after the other
        out_smem.store((dk * dk_scale).to(dk_desc.dtype))
        fence_async_shared()
        tma_store(dk_desc, [k_row, 0], out_smem)
        tma.store_wait(0)
        out_smem.store((dv * dv_scale).to(dv_desc.dtype))
        fence_async_shared()
        tma_store(dv_desc, [k_row, 0], out_smem)
        tma.store_wait(0)
    else:  # K's and V's buffers are free (every wgmma reading them has retired)
        k_smem.store((dk * dk_scale).to(dtype))
        v_smem.store((dv * dv_scale).to(dtype))
        fence_async_shared()
        tma_store(dk_desc, [k_row, 0], k_smem)
        tma_store(dv_desc, [k_row, 0], v_smem)
        tma.store_wait(0)


@gluon.jit
def _dkdv_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, LSE, DELTA, dk_scale, dv_scale, qk_scale, S,
                 NUM_N, DQ_ACC, TICKETS, HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, CAUSAL: gl.constexpr, SPLIT_DS: gl.constexpr, OVERLAP: gl.constexpr,
                 OUT_SEPARATE: gl.constexpr, DQ_ORDERED: gl.constexpr, DQ_DEFER: gl.constexpr,
                 GROUP: gl.constexpr, PDL: gl.constexpr, LOAD_REGS: gl.constexpr, num_warps: gl.constexpr):
    """One program a (key block, batch x head) tile, NUM_N key blocks a head; descriptors over [B*H*S, D] views.
    OUT_SEPARATE: dk_desc / dv_desc hold another dtype than the inputs (one more [BLOCK_N, D] buffer).
    DQ_ORDERED: DQ_ACC (fp32 [B*H, D, S]: dQ^T a head) and TICKETS (int32 [B*H*S / BLOCK_M], zeros) take dQ (one
    more [BLOCK_N, BLOCK_M] buffer, dS^T's); else LSE stands in for both, unused. The grid is head-major, key
    blocks fastest (_dkdv_tile_gl), so a head's programs start before any later head's (the deadlock argument).
    PDL: each program lets the next kernel launch as soon as it has started (griddepcontrol.launch_dependents):
    the dQ kernel, launched with programmatic dependent launch, reads nothing this one writes, so its programs
    may take the SMs this grid's last wave leaves idle."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [BLOCK_N, HEAD_D], v_desc.layout)
    if OUT_SEPARATE:
        out_smem = gl.allocate_shared_memory(dk_desc.dtype, [BLOCK_N, HEAD_D], dk_desc.layout)
    else:
        out_smem = k_smem
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_D], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_D], do_desc.layout)
    vec_smem: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], vec_smem)
    dlt_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], vec_smem)
    if DQ_ORDERED:
        ds_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        ds_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_N, BLOCK_M], ds_layout)
    else:
        ds_smem = k_smem  # not used
    if DQ_DEFER:  # 8-byte pairs swizzled by row: the wgmma layout's stores (8 rows x 4 pairs) hit distinct banks
        dqt_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=2, per_phase=1, max_phase=8, order=[1, 0])
        dqt_smem = gl.allocate_shared_memory(gl.float32, [HEAD_D, BLOCK_M], dqt_layout)
    else:
        dqt_smem = k_smem  # not used
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    qdo_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(st), count=1)
        mbarrier.init(do_ready.index(st), count=2)  # the dO tile's transaction and the lse2 / delta stores
        mbarrier.init(qdo_empty.index(st), count=1)
    gl.warp_specialize([
        (_dkdv_consumer, (dk_desc, dv_desc, k_smem, v_smem, out_smem, q_smem, do_smem, lse_smem, dlt_smem, kv_bar,
                          q_ready, do_ready, qdo_empty, dk_scale, dv_scale, qk_scale, S, NUM_N, ds_smem,
                          dqt_smem, DQ_ACC, TICKETS, num_warps, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CAUSAL, SPLIT_DS,
                          OVERLAP, OUT_SEPARATE, DQ_ORDERED, DQ_DEFER, GROUP)),
        (_dkdv_loader, (q_desc, do_desc, k_desc, v_desc, LSE, DELTA, k_smem, v_smem, q_smem, do_smem, lse_smem,
                        dlt_smem, kv_bar, q_ready, do_ready, qdo_empty, S, NUM_N, BLOCK_M, BLOCK_N, STAGES,
                        CAUSAL, DQ_ORDERED, GROUP)),
    ], [1], [LOAD_REGS])


# ---- dQ: one program a query block ------------------------------------------------------------------------------
@gluon.jit
def _dq_tile_gl(S, NUM_M, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, GROUP: gl.constexpr):
    """(row of the program's first query, of its head's first key, the key-block count). Tiles run head by head;
    causal, a head's last query blocks (the most keys) first (GROUP > 0: across groups of heads, _group_order)."""
    bh, m = _group_order(gl.program_id(0), NUM_M, CAUSAL and GROUP > 0, GROUP)
    if CAUSAL:
        m = NUM_M - 1 - m
        n_blocks = (m * BLOCK_M + BLOCK_M) // BLOCK_N
    else:
        n_blocks = S // BLOCK_N
    return bh * S + m * BLOCK_M, bh * S, n_blocks


@gluon.jit
def _dq_loader(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qdo_bar, k_ready, v_ready, k_empty,
               v_empty, S, NUM_M, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
               CAUSAL: gl.constexpr, GROUP: gl.constexpr):
    """The producer (1 warp): the program's Q and dO once, then K and V of key blocks 0 .. n-1 through the ring."""
    q_row, kv_row0, n_blocks = _dq_tile_gl(S, NUM_M, BLOCK_M, BLOCK_N, CAUSAL, GROUP)
    for i in range(n_blocks):
        st = i % STAGES
        ph = (i // STAGES) & 1
        row = kv_row0 + i * BLOCK_N
        mbarrier.wait(k_empty.index(st), ph ^ 1)
        mbarrier.expect(k_ready.index(st), k_desc.block_type.nbytes)
        tma_load(k_desc, [row, 0], k_ready.index(st), k_smem.index(st))
        if i == 0:
            mbarrier.expect(qdo_bar, 2 * q_desc.block_type.nbytes)
            tma_load(q_desc, [q_row, 0], qdo_bar, q_smem)
            tma_load(do_desc, [q_row, 0], qdo_bar, do_smem)
        mbarrier.wait(v_empty.index(st), ph ^ 1)
        mbarrier.expect(v_ready.index(st), v_desc.block_type.nbytes)
        tma_load(v_desc, [row, 0], v_ready.index(st), v_smem.index(st))


@gluon.jit
def _dq_step(i, offset, dq, lse, dlt, q_smem, do_smem, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, qk_scale,
             mma_s: gl.constexpr, op_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             STAGES: gl.constexpr, MASK: gl.constexpr, SPLIT_DS: gl.constexpr, OVERLAP: gl.constexpr):
    """Key block i (ring slot i % STAGES): S = Q K^T and dP = dO V^T issued together, P = exp2(S c - lse2) while dP
    runs (OVERLAP), V's slot handed back, dS = P (dP - delta), dQ += dS K (hi, then lo with SPLIT_DS), K's slot
    handed back once they retire. MASK: the block crosses the diagonal; offset = its first key's position minus
    the query block's first (query row r, key column c kept where c + offset <= r)."""
    dtype: gl.constexpr = q_smem.dtype
    st = i % STAGES
    ph = (i // STAGES) & 1
    k_t = k_smem.index(st)
    v_t = v_smem.index(st)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma_s)
    mbarrier.wait(k_ready.index(st), ph)
    s = warpgroup_mma(q_smem, k_t.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(st), ph)
    dp = warpgroup_mma(do_smem, v_t.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    if OVERLAP:
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
    else:
        s, dp = warpgroup_mma_wait(num_outstanding=0, deps=(s, dp))
    p = gl.exp2(s * qk_scale - gl.expand_dims(lse, 1))
    if MASK:
        r = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma_s))
        c = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_s)) + offset
        p = gl.where(gl.expand_dims(c, 0) <= gl.expand_dims(r, 1), p, 0.0)
    if OVERLAP:
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp,))
    mbarrier.arrive(v_empty.index(st), count=1)
    ds = p * (dp - gl.expand_dims(dlt, 1))
    hi_op, lo_op = _ds_operands(ds, op_layout, dtype, SPLIT_DS)
    dq = warpgroup_mma(hi_op, k_t, dq, is_async=True)
    if SPLIT_DS:
        dq = warpgroup_mma(lo_op, k_t, dq, is_async=True)
    dq, hi_op, lo_op = warpgroup_mma_wait(num_outstanding=0, deps=(dq, hi_op, lo_op))
    mbarrier.arrive(k_empty.index(st), count=1)
    return dq


@gluon.jit
def _dq_consumer(dq_desc, LSE, DELTA, q_smem, out_smem, do_smem, k_smem, v_smem, qdo_bar, k_ready, v_ready, k_empty,
                 v_empty, dq_scale, qk_scale, S, NUM_M, W: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                 SPLIT_DS: gl.constexpr, OVERLAP: gl.constexpr, GROUP: gl.constexpr):
    """The consumer warp groups (W warps, queries on rows): per key block, S = Q K^T and dP = dO V^T issued
    together, P = exp2(S c - lse2) while dP runs (OVERLAP), dS = P (dP - delta), dQ += dS K (hi, lo with SPLIT_DS).
    Epilogue: dQ dq_scale through out_smem (Q's buffer, or one of the output dtype), TMA store."""
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1],
                                                    instr_shape=[16, BLOCK_N, 16])
    mma_d: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1],
                                                    instr_shape=[16, HEAD_D, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_d, k_width=2)
    q_row, kv_row0, n_blocks = _dq_tile_gl(S, NUM_M, BLOCK_M, BLOCK_N, CAUSAL, GROUP)
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma_s))
    lse = gl.load(LSE + q_row + rows)
    dlt = gl.load(DELTA + q_row + rows)
    dq = gl.zeros([BLOCK_M, HEAD_D], gl.float32, mma_d)
    mbarrier.wait(qdo_bar, 0)
    # causal: the last BLOCK_M / BLOCK_N key blocks cross the diagonal (masked), the ones before are whole
    n_full = n_blocks - (BLOCK_M // BLOCK_N if CAUSAL else 0)
    for i in range(0, n_full):
        dq = _dq_step(i, 0, dq, lse, dlt, q_smem, do_smem, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                      qk_scale, mma_s, op_layout, BLOCK_M, BLOCK_N, STAGES, False, SPLIT_DS, OVERLAP)
    # the diagonal's blocks take dS as hi + lo whatever SPLIT_DS: a causal row's first keys are few, and their dS
    # sum to zero, so dS rounded once leaves dQ's residue there (the fp16 path's dq rejected on 2 elements
    # of row 1 of a uniform draw); one more product on BLOCK_M / BLOCK_N of a query block's blocks
    for i in range(n_full, n_blocks):
        dq = _dq_step(i, i * BLOCK_N - (q_row - kv_row0), dq, lse, dlt, q_smem, do_smem, k_smem, v_smem, k_ready,
                      v_ready, k_empty, v_empty, qk_scale, mma_s, op_layout, BLOCK_M, BLOCK_N, STAGES, True,
                      True, OVERLAP)
    out_smem.store((dq * dq_scale).to(dq_desc.dtype))
    fence_async_shared()
    tma_store(dq_desc, [q_row, 0], out_smem)
    tma.store_wait(0)


@gluon.jit
def _dq_kernel(q_desc, do_desc, k_desc, v_desc, dq_desc, LSE, DELTA, dq_scale, qk_scale, S, NUM_M,
               HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
               CAUSAL: gl.constexpr, SPLIT_DS: gl.constexpr, OVERLAP: gl.constexpr, OUT_SEPARATE: gl.constexpr,
               GROUP: gl.constexpr, LOAD_REGS: gl.constexpr, num_warps: gl.constexpr):
    """One program a (query block, batch x head) tile, NUM_M query blocks a head; descriptors over [B*H*S, D].
    OUT_SEPARATE: dq_desc holds another dtype than the inputs (one more [BLOCK_M, D] buffer)."""
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_M, HEAD_D], q_desc.layout)
    if OUT_SEPARATE:
        out_smem = gl.allocate_shared_memory(dq_desc.dtype, [BLOCK_M, HEAD_D], dq_desc.layout)
    else:
        out_smem = q_smem
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [BLOCK_M, HEAD_D], do_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
    qdo_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(qdo_bar, count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(st), count=1)
        mbarrier.init(v_ready.index(st), count=1)
        mbarrier.init(k_empty.index(st), count=1)
        mbarrier.init(v_empty.index(st), count=1)
    gl.warp_specialize([
        (_dq_consumer, (dq_desc, LSE, DELTA, q_smem, out_smem, do_smem, k_smem, v_smem, qdo_bar, k_ready, v_ready,
                        k_empty, v_empty, dq_scale, qk_scale, S, NUM_M, num_warps, BLOCK_M, BLOCK_N, HEAD_D, STAGES,
                        CAUSAL, SPLIT_DS, OVERLAP, GROUP)),
        (_dq_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qdo_bar, k_ready, v_ready,
                      k_empty, v_empty, S, NUM_M, BLOCK_M, BLOCK_N, STAGES, CAUSAL, GROUP)),
    ], [1], [LOAD_REGS])


@triton.jit
def _dq_finish_kernel(ACC, DQ, S, scale, HEAD_D: tl.constexpr, BLOCK_S: tl.constexpr):
    """dq[bh, s, d] = acc[bh, d, s] * scale in dq's dtype: dq_ordered's fp32 dQ^T accumulator [B*H, D, S]
    transposed (scale = sm_scale x grad_scale). Program (j, bh): queries j BLOCK_S .. + BLOCK_S of head bh, a
    [BLOCK_S, HEAD_D] tile loaded through the transposed strides (Triton's coalescing gives the load and the store
    each its contiguous dimension, the transpose going through shared memory); queries past S masked."""
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    cols = tl.arange(0, HEAD_D)
    mask = rows[:, None] < S
    acc = tl.load(ACC + bh * HEAD_D * S + (cols[None, :] * S + rows[:, None]), mask=mask)
    tl.store(DQ + bh * S * HEAD_D + (rows[:, None] * HEAD_D + cols[None, :]), (acc * scale).to(DQ.dtype.element_ty),
             mask=mask)


FINISH_BLOCK_S = 64  # queries a _dq_finish_kernel program (32 fp32 a thread at D 128, 8 warps)


def dq_finish(acc: torch.Tensor, dq: torch.Tensor, scale: float, block_s: int = FINISH_BLOCK_S) -> torch.Tensor:
    """dq [B, H, S, D] (contiguous; bf16, fp16 or fp32) = acc [B*H, D, S] fp32 transposed, times scale."""
    bh, d, s = acc.shape
    _dq_finish_kernel[(triton.cdiv(s, block_s), bh)](acc, dq, s, scale, HEAD_D=d, BLOCK_S=block_s, num_warps=8)
    return dq


def dq_ordered_schedule(num_n: int, num_m: int, causal: bool) -> list[list[tuple[int, int]]]:
    """dq_ordered's schedule, as the kernel computes it: for key block n, its steps' (query block, rank) in order,
    query block (c n + i) mod M at step i (c = M / N), rank i // c (non-causal: i in 0 .. M-1; causal:
    i in 0 .. M-1-c n, from the diagonal on). The mirror in tests/test_attention_gluon_bwd.py adds in this order."""
    c = num_m // num_n
    return [[((c * n + i) % num_m, i // c) for i in range(num_m - (c * n if causal else 0))] for n in range(num_n)]


# ---- variants (benchmarks/sweep_attention_gluon_bwd.py checks and times them; tests compile them for sm_90) -----
# name -> attention_bwd_gluon knobs (split_ds is the call's own argument: every variant runs with either)
VARIANTS = {
    "64x128 s2 / dq 128x64 s2": dict(),
    "64x128 s4 / dq 128x64 s3": dict(stages=4, dq_stages=3),
    "64x128 s2 / dq 128x128 s2": dict(dq_block_n=128),
    "64x128 s2 / dq 128x64 s2 serial": dict(overlap=False),
}

GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
HOPPER_SMEM = 232448  # bytes of shared memory a block may use on sm_90
DQ_DEFER_DEFAULT = True  # dq_ordered's dq_defer when not given (the guess at the faster; not measured)


def bwd_smem_bytes(head_dim: int, kept: int, streamed: int, stages: int, dkdv: bool, out_separate: bool) -> int:
    """Shared memory of one of the two kernels (2-byte elements): the kept rows' two tiles (K, V or Q, dO), the
    ring of the streamed blocks' two tiles, the dK/dV kernel's lse2 / delta vectors, out_separate's output tile, and
    1 KB for the barriers and alignment."""
    smem = 2 * head_dim * (2 * kept + 2 * stages * streamed) + 1024
    if dkdv:
        smem += 2 * 4 * stages * streamed
    if out_separate:
        smem += 2 * head_dim * kept
    return smem


def fits(knobs: dict, head_dim: int = 128, out_separate: bool = False) -> bool:
    """Whether both kernels of a variant (bwd_launch_config's knobs) fit the shared memory a block may use."""
    kw = {**dict(block_m=64, block_n=128, stages=2, dq_block_m=128, dq_block_n=64, dq_stages=2), **knobs}
    return max(bwd_smem_bytes(head_dim, kw["block_n"], kw["block_m"], kw["stages"], True, out_separate),
               bwd_smem_bytes(head_dim, kw["dq_block_m"], kw["dq_block_n"], kw["dq_stages"], False,
                              out_separate)) <= HOPPER_SMEM


def check_co_resident(key_blocks: int, sm_count: int) -> None:
    """dq_ordered's programs of a head wait on each other (the module docstring's deadlock argument), so a head's
    key_blocks programs must be resident at once: ValueError where they are more than the device's SMs (the dK/dV
    kernel runs one program an SM)."""
    if key_blocks > sm_count:
        raise ValueError(f"attention_bwd_gluon: dq_ordered needs a head's {key_blocks} key-block programs resident "
                         f"at once, more than the device's {sm_count} SMs: use S <= {128 * sm_count} or "
                         "dq_ordered=False")


def bwd_launch_config(head_dim: int, block_m: int = 64, block_n: int = 128, stages: int = 2, dq_block_m: int = 128,
                      dq_block_n: int = 64, dq_stages: int = 2, overlap: bool = True, split_ds: bool = True,
                      maxnreg: int | None = None, out_separate: bool = False, dq_ordered: bool = False,
                      dq_defer: bool = DQ_DEFER_DEFAULT, group_heads: int = 0, pdl: bool = False
                      ) -> tuple[dict, dict]:
    """(dK/dV kernel's constexprs and launch options, dQ kernel's) of one variant; ValueError where it is not one
    these kernels have: the consumers are 8 warps (two 64-row warp groups) over the 128 rows a program keeps
    (block_n keys in dK/dV, dq_block_m queries in dQ), the streamed blocks 64 or 128 rows, the shared memory
    within the 227 KB a block may use (out_separate: one more kept-row buffer, for outputs of another dtype).
    dq_ordered: dQ in the dK/dV kernel (DQ_ORDERED; dS rounded once, D 128; no dQ kernel: its knobs unused);
    dq_defer: each step's dQ share added during the next step (DQ_DEFER; ignored without dq_ordered, so that a
    knob set can carry it to the bf16 path, which drops dq_ordered). group_heads: causal programs ordered
    heaviest first across groups of that many heads (GROUP, _group_order; 0: head by head; not with dq_ordered,
    whose tickets need a head's programs to start together). pdl: the dQ kernel launched with programmatic
    dependent launch once every dK/dV program has started (PDL; its launch option launch_pdl)."""
    if group_heads < 0 or (group_heads and dq_ordered):
        raise ValueError(f"attention_bwd_gluon: group_heads is 0 or a positive head count, and 0 with dq_ordered "
                         f"(got {group_heads})")
    if dq_ordered and (split_ds or head_dim != 128):
        raise ValueError("attention_bwd_gluon: dq_ordered takes dS rounded once (split_ds=False) at head dim 128")
    if head_dim not in (64, 128):
        raise ValueError(f"attention_bwd_gluon: head dim {head_dim} is not 64 or 128")
    if block_n != 128 or dq_block_m != 128:
        raise ValueError(f"attention_bwd_gluon: the rows a program keeps (block_n {block_n}, dq_block_m "
                         f"{dq_block_m}) must be 128: two 64-row consumer warp groups")
    if block_m not in (64, 128) or dq_block_n not in (64, 128):
        raise ValueError(f"attention_bwd_gluon: the streamed blocks (block_m {block_m}, dq_block_n {dq_block_n}) "
                         "must be 64 or 128 rows")
    if stages < 1 or dq_stages < 1:
        raise ValueError(f"attention_bwd_gluon: stages >= 1 (got {stages}, {dq_stages})")
    for what, kept, streamed, st in (("dK/dV", block_n, block_m, stages), ("dQ", dq_block_m, dq_block_n, dq_stages)):
        smem = bwd_smem_bytes(head_dim, kept, streamed, st, what == "dK/dV", out_separate)
        if dq_ordered and what == "dK/dV":  # dS^T's tile (and dq_defer's fp32 dQ^T)
            smem += 2 * kept * streamed + (4 * head_dim * streamed if dq_defer else 0)
        if smem > HOPPER_SMEM:
            raise ValueError(f"attention_bwd_gluon: the {what} kernel's {smem} bytes of shared memory at {kept} kept "
                             f"rows, {streamed} x {st} stages")
    if maxnreg is None:  # 12 warps (8 consumer, the producer's warp group): 168, one program an SM
        maxnreg = 168
    common = dict(OVERLAP=bool(overlap), SPLIT_DS=bool(split_ds), OUT_SEPARATE=bool(out_separate), LOAD_REGS=24,
                  num_warps=8, maxnreg=maxnreg, GROUP=int(group_heads))
    return (dict(BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, DQ_ORDERED=bool(dq_ordered),
                 DQ_DEFER=bool(dq_ordered and dq_defer), PDL=bool(pdl and not dq_ordered), **common),
            dict(BLOCK_M=dq_block_m, BLOCK_N=dq_block_n, STAGES=dq_stages, **common))


def attention_bwd_gluon(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse2: torch.Tensor,
                        delta: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
                        split_ds: bool = True, out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                        out_dtype: torch.dtype | None = None, grad_scale: float = 1.0,
                        **knobs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), each like q, of o = softmax(q k^T * scale) v for the upstream gradient do, given the
    forward's base-2 lse2 [B, H, S] fp32 (seeds/attention.py's convention: p = exp2(s * scale * log2(e) - lse2))
    and delta [B, H, S] fp32 (delta_i = sum_j P_ij dP_ij, or rowsum(do * o): attention_fwd_with_delta makes it).
    Dense [B, H, S, D] bf16/fp16 CUDA tensors of one shape, D 64 or 128, S a multiple of every block size; else
    ValueError. split_ds: dS enters the dK and dQ products as two operands (its rounding and the rest: the
    `precise` backward), else rounded once. knobs: bwd_launch_config's (block_m, block_n, stages, dq_block_m,
    dq_block_n, dq_stages, overlap, maxnreg, dq_ordered, dq_defer, group_heads, pdl). out: (dq, dk, dv) to write into
    (contiguous, q's shape, out_dtype). dq_ordered: dQ's share of each step added at the program's rank (the
    module docstring's rotated order) into a transposed fp32 accumulator by the dK/dV kernel (no S and dP
    recompute; bitwise repeatable), then _dq_finish_kernel; ValueError where a head's key blocks outnumber the SMs
    (check_co_resident); v2 measured slower than the dQ kernel.
    out_dtype (bf16 / fp16; q's by default): the gradients' dtype, e.g. bf16 from fp16 working copies
    (attention_fwd_bwd_gluon). grad_scale: every gradient is multiplied by it before its rounding (the inverse of
    a power-of-two scale the caller gave do)."""
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape or do.shape != q.shape:
        raise ValueError(f"attention_bwd_gluon: do, q, k, v must be [B, H, S, D] of one shape, not "
                         f"{tuple(do.shape)}, {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.dtype not in GL_DTYPES or any(t.dtype != q.dtype for t in (k, v, do)):
        raise ValueError(f"attention_bwd_gluon: bf16 or fp16 inputs of one dtype, not {q.dtype}, {k.dtype}, "
                         f"{v.dtype}, {do.dtype}")
    b, h, s, d = q.shape
    if lse2.shape != q.shape[:3] or delta.shape != q.shape[:3] or lse2.dtype != torch.float32 \
            or delta.dtype != torch.float32:
        raise ValueError(f"attention_bwd_gluon: lse2 and delta must be [B, H, S] = {tuple(q.shape[:3])} fp32")
    out_dtype = q.dtype if out_dtype is None else out_dtype
    if out_dtype not in GL_DTYPES:
        raise ValueError(f"attention_bwd_gluon: out_dtype must be bf16 or fp16, not {out_dtype}")
    if not (math.isfinite(grad_scale) and grad_scale > 0):
        raise ValueError(f"attention_bwd_gluon: grad_scale must be positive and finite, not {grad_scale}")
    cfg_kv, cfg_q = bwd_launch_config(d, split_ds=split_ds, out_separate=out_dtype != q.dtype, **knobs)
    blocks = (cfg_kv["BLOCK_M"], cfg_kv["BLOCK_N"], cfg_q["BLOCK_M"], cfg_q["BLOCK_N"])
    if any(s % blk for blk in blocks):
        raise ValueError(f"attention_bwd_gluon: S = {s} is not a multiple of the block sizes {blocks}")
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    if not scale > 0:
        raise ValueError(f"attention_bwd_gluon: sm_scale must be positive, not {scale}")
    if not all(t.is_cuda for t in (do, q, k, v, lse2, delta)):
        raise ValueError("attention_bwd_gluon: Gluon kernels run on CUDA devices only (no CPU interpreter)")
    if cfg_kv["DQ_ORDERED"]:
        check_co_resident(s // cfg_kv["BLOCK_N"], torch.cuda.get_device_properties(q.device).multi_processor_count)
    if out is None:
        dq, dk, dv = (torch.empty(q.shape, dtype=out_dtype, device=q.device) for _ in range(3))
    else:
        dq, dk, dv = out
        if any(t.shape != q.shape or t.dtype != out_dtype or not t.is_contiguous() for t in out):
            raise ValueError(f"attention_bwd_gluon: out must be (dq, dk, dv), each contiguous, of q's shape and "
                             f"{out_dtype}")
    rows = b * h * s
    q2, k2, v2, do2 = (t.contiguous().view(rows, d) for t in (q, k, v, do))
    lse2, delta = lse2.contiguous(), delta.contiguous()

    def desc(t, block_rows):
        layout = gl.NVMMASharedLayout.get_default_for([block_rows, d], GL_DTYPES[t.dtype])
        return GluonTensorDescriptor(t, [rows, d], [d, 1], [block_rows, d], layout)

    m1, n1 = cfg_kv["BLOCK_M"], cfg_kv["BLOCK_N"]
    num_n = s // n1
    if cfg_kv["DQ_ORDERED"]:  # every column of the accumulator has a rank-0 store: no zeroing
        dq_acc = torch.empty((b * h, d, s), dtype=torch.float32, device=q.device)
        tickets = torch.zeros(rows // m1, dtype=torch.int32, device=q.device)
    else:
        dq_acc = tickets = lse2  # not read
    _dkdv_kernel[(num_n * b * h,)](
        desc(q2, m1), desc(do2, m1), desc(k2, n1), desc(v2, n1), desc(dk.view(rows, d), n1), desc(dv.view(rows, d), n1),
        lse2, delta, scale * grad_scale, grad_scale, scale * LOG2E, s, num_n, dq_acc, tickets, HEAD_D=d,
        CAUSAL=bool(causal), **cfg_kv)
    if cfg_kv["DQ_ORDERED"]:
        dq_finish(dq_acc, dq, scale * grad_scale)
        return dq, dk, dv
    m2, n2 = cfg_q["BLOCK_M"], cfg_q["BLOCK_N"]
    num_m = s // m2
    _dq_kernel[(num_m * b * h,)](
        desc(q2, m2), desc(do2, m2), desc(k2, n2), desc(v2, n2), desc(dq.view(rows, d), m2), lse2, delta,
        scale * grad_scale, scale * LOG2E, s, num_m, HEAD_D=d, CAUSAL=bool(causal), **cfg_q,
        **({"launch_pdl": True} if cfg_kv["PDL"] else {}))
    return dq, dk, dv
