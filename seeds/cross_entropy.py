"""Cross-entropy over a large vocabulary, forward and backward together: the loss and dlogits (ignore_index, label
smoothing, reduction mean or sum).

logits: [N, V] (8192 x 128256 bf16 in the task), any float dtype, fp32 maths; target: [N] int64/int32. Returns the
loss (fp32 scalar) and dlogits ([N, V], the logits' dtype), the gradient of the loss for an upstream gradient of 1:
    lse      = log sum_j exp(x_j)
    loss_row = (1 - eps) (lse - x[target]) + eps (lse - sum_j x_j / V)              (eps: label smoothing)
    dx_j     = scale (exp(x_j - lse) - (1 - eps) [j == target] - eps / V)            (scale: 1 / n_valid or 1)
    ignored rows: loss 0 and dx 0; the mean divides by n_valid, the non-ignored rows (0 / 0 = NaN when none is).
Bytes (bf16, 8192 x 128256): at least one read of the logits and one write of dlogits, 4.2 GB: 0.99 ms at the
H200's copy bandwidth of 4,244 GB/s. A row (250 KB in bf16) does not fit in one program's registers, so the
gradient needs the row a second time; the forms differ in where that second read comes from.

PERSISTENT (the default): about one program per multiprocessor, each looping over rows pid, pid + P, ... For a row:
    pass 1, columns in order:    the running max m and sum d of exp(x - m) (per lane with LANES, the default; else
                                 per tile), the sum of x (label smoothing only);
    pass 2, columns in REVERSE:  dx from a second read of the row. With P rows in flight (P x 250 KB: 33 MB at
                                 P = 132, under the 50-60 MB L2) the second read should come from L2, and reversing
                                 the order re-reads the most recently loaded tiles first (if L2 overflows, LRU loses
                                 the oldest tiles, not all of them).
The loads are software-pipelined by hand: each tile's load is issued before the previous tile is used, the last
tile of pass 1 is the first of pass 2 (kept in registers), and the last load of pass 2 fetches the next row's first
tile, so HBM never waits on a row boundary. Eviction hints (HINTS) keep pass-1 lines in L2 and drop pass-2 lines
and the gradient's stores first. With P = N it is Liger's one-program-per-row form (the hardware schedules rows).
Options of PERSISTENT (defaults off; benchmarks/sweep_ce.py times them, H200 numbers not measured yet):
  SUB (sub=2, 4): a tile is SUB x BLOCK consecutive columns, folded into the same BLOCK lanes (a lane's max of its
      SUB values, one exponential each and one rescale): SUB times the bytes in flight per program, the same lane
      state. For pass 1 being latency-bound: with fewer programs the per-SM rate barely rises (P = 66: 2.40 ms).
  SPLIT (split=2, 4): SPLIT programs per row, each on 1/SPLIT of its tiles (the rows' live bytes in L2 divided by
      SPLIT for the same grid); after pass 1 each publishes its (max, sum of exp, sum of x), counts in with a
      release atomic and polls the row's count (acquire) up to SPIN times; all combine the SPLIT segments in
      segment order, so they agree bitwise. One that finds the row incomplete after SPIN polls recomputes every
      segment's statistics from the logits (the same folding, the same values): always the earlier program of a
      group on the interpreter, which runs programs one after another; on a GPU only if a partner is not resident
      (the grid is at most one program per SM). Not in place: a partner may still be reading the logits.
  STORE (store_cache=".cs", ".cg"): the gradient's stores streaming / L2-only, in place of the evict_first hint
      (PTX allows no eviction hint beside them).
  Pass 2's re-reads (benchmarks/sweep_ce.py --tail; H200 numbers not measured yet): ORDER (order=
      "oldest_first": tile 0, read longest ago and the likeliest to have left L2, first, then n-2 .. 1;
      "forward"); HEAD (head=True): tile 0 kept in registers to the end of pass 2 (+40 registers at 8192-column
      tiles / 16 warps, so sub=1 there: 98 registers; at 16384-column tiles it spills 172-340 bytes);
      TAIL_DROP: the last tile, which pass 2 takes from registers, loaded evict_first rather than evict_last.
      None of these changes a bit of the results. (The L1 carveout, a driver attribute set through ctypes, is not
      an option: the harness refuses ctypes in a candidate, and a seed is one.)
SMEM (Gluon, triton.experimental.gluon; CUDA only, not in place): PERSISTENT's rows and maths (SUB x BLOCK tiles
folded into BLOCK lanes, the same expressions, not necessarily bitwise: the layouts may differ) with the row's
first KEPT tiles held in shared memory between the passes (6 x 32 KB at 8192 x 2: 192 KB of the 227 KB a block
may take) and the last in registers, so pass 2 re-reads from global memory only the tiles between (one at 128256
columns, the most recently loaded): the logits cross HBM about once. Plain Triton has no shared-memory tensors,
hence Gluon; the interpreter cannot run it (tests compile it for sm_90 only; the sweep checks it against float64
on the GPU). H200 (sweep_ce.py --tail): with the kept tiles copied by cp.async during the previous row's
pass 2 (async_kept) **1.274 ms** at 8192 x 2 / 16 warps (1.285 at 4096 x 2), 1.001 on L2-resident logits; without
cp.async 1.427; the persistent default 1.333 in the same run. ModelNew takes it on sm_90 (gpu_variant). In the
same run the persistent form's pass-2 options: order="forward" 1.316, oldest_first + tail_drop 1.324,
oldest_first 1.339, tail_drop 1.360, P = 100 1.529, head 1.540, sub 4 at 4096 columns 1.350.
Not tried, and why: thread-block clusters holding a row across CTAs (QuACK's form): Triton 3.6
(the H200's) fails to compile any reduction across a num_ctas > 1 cluster (TritonGPUPlanCTAPass: "parent layout
must have at least rank >= 2" or "Result has an invalid layout"); Triton 3.9 compiles it (mapa,
shared::cluster). TMA tile loads: Triton 3.6's tensor-descriptor load takes no eviction hint (the hints are worth
7%) and lands in shared memory, overlapping only under the software pipeliner, i.e. STAGED's structure.
STAGED: the same rows and maths as PERSISTENT (bitwise the same results), each pass a plain tile loop under
tl.range(num_stages=STAGES): on sm_90 Triton turns the tile loads into cp.async copies into shared memory,
STAGES - 1 tiles in flight (PERSISTENT holds one, in registers: 16 KB per SM at 8192 columns, under what Little's
law asks at the H200's bandwidth). Fewer registers (sm_90 cubin, Triton 3.9: 50-52 at 8192 columns / 32 warps,
54 at 4096 / 16, against 109 for PERSISTENT at 8192 / 16), so 32 warps per SM, or two programs per SM. The
pipeline empties at each pass and row boundary; more programs per SM cover that. H200
(do_bench, one run): 1.466 ms at P = 264, BLOCK 4096, 8 warps, 4 stages, against 1.493 for the PERSISTENT default:
1.8% in a single run, not adopted as the default on that alone. Both reach 66-68% of copy; with every row the same
(so both passes hit L2) the PERSISTENT form runs at 0.978 ms, the copy floor: what holds it back is the second
read of each row missing L2 (6.3 GB moved instead of 4.2), not the kernel's issue rate.
TWO_PASS: rows split into SEGMENTS programs of BLOCK columns; a statistics launch (m_s, d_s, sum x, x[target] per
segment), then a gradient launch that combines the row's statistics in segment order and reads the logits again
(6.3 GB of HBM traffic).
RESIDENT: each row read once: SPLIT programs share a row, each holding its share in registers (one R x BLOCK
tile), meeting once per row to combine their statistics, writing the gradient from the registers (4.2 GB). On the
H200 (sweep_ce.py --resident) every variant was slower than PERSISTENT: 1.88-3.04 ms against 1.332, and
1.80 ms even on L2-resident logits: a program loads its share, waits for it, reduces, waits for its partners and
stores, with nothing of its own to overlap. Kept as an option, not the default.
RENDEZVOUS: the segments of a row meet in the middle of one launch (publish statistics, count in with a release
atomic, wait for the row) and write the gradient from registers (4.2 GB); waiting programs hold SM slots. The
interpreter cannot run it (it runs programs one after another).
Every form writes per-row losses; the mean's divisor is counted by one small kernel first, and the losses are summed
by another in a fixed order, so repeated runs agree bitwise (no float atomics).

Measured on the H200 (benchmarks/bench_ce.py, docs/bench-ce.md; torch 2.11.0+cu130, Triton 3.6.0,
8192 x 128256 bf16, eps 0 / mean, 3 rotating input sets): PERSISTENT at one program per SM (132), 8192 columns,
16 warps, LANES: 1.494 ms (2,813 GB/s on 4.2 GB, 66% of copy), the default; one program per row (P = N) at 16384
columns / 16 warps 1.498 ms; TWO_PASS 2.209 ms; Liger 0.8.5 2.215 ms, torch.compile 2.593 ms, eager 13.50 ms in the
same run: 1.48x Liger, 1.74x torch.compile. Swept (benchmarks/sweep_ce.py): SUB = 2 (now the default) 1.331 ms,
3,158 GB/s, against 1.494 for SUB = 1, Liger 2.106, torch.compile 2.594 in the same run; SPLIT 2/4 1.71-2.07 ms; with
every row the same (both reads from L2) 0.978 ms, the copy floor: the second read is what remains. The target of
1.3 ms is not met (by 2.4%). RENDEZVOUS: 3.4-5.4 ms (docs/bench-mix.md).
A PIPELINED form (pass 1 of a program's row k interleaved with pass 2 of its row k - 1 in the same tile iterations)
was removed: in that run every one of its variants returned a wrong gradient on the H200 (dlogits rel L2 inf; 2.8e6
writing in place) while passing every test on the CPU interpreter. The cause is unexplained: possibly a race between
a program's pass-2 stores and its pass-1 loads across iterations, or a Triton 3.6 code-generation issue. Its best
variant timed 1.504 ms, no faster than PERSISTENT.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from seeds._common import sm_count

CRUCIBLE_SEED = {
    "name": "cross_entropy",
    "tasks": ["cross_entropy.py", "cross_entropy_smooth_sum.py"],
    "ops": ["cross-entropy fwd+bwd (ignore_index, label smoothing, mean/sum)"],
}

FORMS = ("persistent", "staged", "two_pass", "rendezvous", "resident", "smem")
DEFAULT_FORM = "persistent"
STORE_CACHE = ("", ".cs", ".cg", ".wt")  # the gradient stores' cache modifiers (tl.store cache_modifier)

# _ce_segments_kernel modes (constexpr globals: a kernel may read no other globals)
MODE_STATS, MODE_GRAD, MODE_FUSED = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
LOG2E = tl.constexpr(1.4426950408889634)
# pass 2's order of the re-read tiles in the persistent form (_reread_tile)
ORDERS = ("reverse", "forward", "oldest_first")
ORDER_REVERSE, ORDER_FORWARD, ORDER_OLDEST_FIRST = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def round_bf16_rne(x):
    """fp32 x rounded to the nearest bf16 (ties to even), still in fp32, so that a following bf16 store is exact.
    Used only on the CPU interpreter, whose fp32 -> bf16 conversion truncates (Triton 3.9): over a 100k-element
    vocabulary that bias moves a loss by 1e-4, where the GPU (round to nearest) matches PyTorch."""
    u = x.to(tl.uint32, bitcast=True)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.to(tl.float32, bitcast=True)


@triton.jit
def store_rounded(ptrs, x, mask, RNE: tl.constexpr):
    """Store fp32 x in the pointers' dtype, rounded to nearest bf16 first where RNE (the interpreter: needs_rne)."""
    if RNE:
        x = round_bf16_rne(x)
    tl.store(ptrs, x.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _count_valid_kernel(TARGET, N, ignore_index, OUT, BLOCK: tl.constexpr):
    """OUT[0] = number of rows whose target is not ignore_index (fp32, one program, fixed order)."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        t = tl.load(TARGET + offs, mask=offs < N, other=ignore_index)
        acc += (t != ignore_index).to(tl.float32)
    tl.store(OUT, tl.sum(acc, axis=0))


# ---- PERSISTENT ------------------------------------------------------------------------------------------------
@triton.jit
def _grad_weights(N_VALID, smoothing, V, MEAN: tl.constexpr):
    """(scale, off_s, hit_s) of the gradient: scale 1 / n_valid for the mean and 1 for the sum, scale eps / V for
    every column and scale (1 - eps) for the target's."""
    if MEAN:
        scale = 1.0 / tl.load(N_VALID)
    else:
        scale = 1.0
    return scale, scale * smoothing / V, scale * (1.0 - smoothing)


@triton.jit
def _fold_lanes(m, d, LANES: tl.constexpr):
    """The max and the sum of exp(x - max) over all lanes, from per-lane running values (LANES) or scalars."""
    if LANES:
        m_row = tl.max(m, axis=0)
        d_row = tl.sum(d * tl.exp2((m - m_row) * LOG2E), axis=0)
    else:
        m_row, d_row = m, d
    return m_row, d_row


@triton.jit
def _row_loss(m, d, sx, x_target, smoothing, V, LANES: tl.constexpr, SMOOTH: tl.constexpr):
    """(lse, loss) of a row from its running max / sum of exponentials (per lane with LANES) and sum of logits."""
    m_row, d_row = _fold_lanes(m, d, LANES)
    lse = m_row + tl.log(d_row)
    loss = lse - x_target
    if SMOOTH:
        loss = (1.0 - smoothing) * loss + smoothing * (lse - tl.sum(sx, axis=0) / V)
    return lse, loss


@triton.jit
def _tile_offsets(BLOCK: tl.constexpr, SUB: tl.constexpr):
    """A tile's column offsets: [BLOCK], or with SUB > 1 [SUB, BLOCK], SUB x BLOCK consecutive columns whose
    per-lane statistics fold into BLOCK lanes (axis 0 lies within a thread: no shuffles)."""
    if SUB == 1:
        offs = tl.arange(0, BLOCK)
    else:
        offs = tl.arange(0, SUB)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    return offs


@triton.jit
def _stats_tile(m, d, sx, x, offs, limit, LANES: tl.constexpr, SMOOTH: tl.constexpr, SUB: tl.constexpr):
    """One tile of pass 1. x: the tile in the logits' dtype (-inf past the row's end), at column offsets offs
    (_tile_offsets); limit: the row's columns left from this tile's start. LANES: m and d are [BLOCK] per-lane
    running values, updated with one exponential,
        up = x > m:   d <- d exp(m - x) + 1, m <- x;   else  d <- d + exp(x - m)     (exp of -|x - m| either way)
    so the loop has no cross-warp reduction; with SUB > 1 a lane takes SUB values at once (its max, then one
    exponential each and one for the rescale); else m and d are the row's scalars, one max and one sum per tile."""
    x = x.to(tl.float32)
    if LANES:
        if SUB == 1:
            diff = x - m
            e = tl.exp2(-tl.abs(diff) * LOG2E)
            up = diff > 0
            d = tl.where(up, d * e + 1.0, d + e)
            m = tl.where(up, x, m)
        else:
            m_new = tl.maximum(m, tl.max(x, axis=0))
            d = d * tl.exp2((m - m_new) * LOG2E) + tl.sum(tl.exp2((x - m_new[None, :]) * LOG2E), axis=0)
            m = m_new
    else:
        m_new = tl.maximum(m, tl.max(x, axis=0))
        d = d * tl.exp2((m - m_new) * LOG2E) + tl.sum(tl.exp2(x * LOG2E - m_new * LOG2E), axis=0)
        m = m_new
    if SMOOTH:
        if SUB == 1:
            sx += tl.where(offs < limit, x, 0.0)
        else:
            sx += tl.sum(tl.where(offs < limit, x, 0.0), axis=0)
    return m, d, sx


@triton.jit
def _store_tile(ptrs, value, mask, DROP: tl.constexpr, STORE: tl.constexpr):
    """A gradient store: with the eviction hint DROP, or with the cache modifier STORE where one is given (PTX
    allows no eviction hint beside .cs and the like)."""
    if STORE == "":
        tl.store(ptrs, value, mask=mask, eviction_policy=DROP)
    else:
        tl.store(ptrs, value, mask=mask, cache_modifier=STORE)


@triton.jit
def _grad_tile(x, dx_ptrs, cols, limit, tgt, lse2, scale, off_s, hit_s, DROP: tl.constexpr, RNE: tl.constexpr,
               STORE: tl.constexpr):
    """dx = scale (exp(x - lse) - eps / V) - scale (1 - eps) [col == target] for one tile, stored in dx's dtype.
    cols: the tile's column offsets; lse2 = lse log2(e); off_s = scale eps / V; hit_s = scale (1 - eps); tgt: the
    target's column in this tile; STORE: the stores' cache modifier ("" or ".cs", ".cg", ...)."""
    dx = tl.exp2(x.to(tl.float32) * LOG2E - lse2) * scale - off_s
    dx = tl.where(cols == tgt, dx - hit_s, dx)
    if RNE:
        dx = round_bf16_rne(dx)
    _store_tile(dx_ptrs + cols, dx.to(dx_ptrs.dtype.element_ty), cols < limit, DROP, STORE)


@triton.jit
def _reread_tile(i, lo, hi, ORDER: tl.constexpr):
    """The tile pass 2 reads at its step i (0 .. hi - lo) among tiles lo .. hi (tile hi + 1, the row's last, is
    still in registers). ORDER_REVERSE (the default): hi .. lo, the most recently loaded first; ORDER_FORWARD:
    lo .. hi (every tile re-read the same number of tile loads after its first read); ORDER_OLDEST_FIRST: lo,
    then hi .. lo + 1 (the oldest tile, the likeliest to have left L2 under LRU, before it ages further)."""
    if ORDER == ORDER_FORWARD:
        tile = lo + i
    elif ORDER == ORDER_OLDEST_FIRST:
        tile = tl.where(i == 0, lo, hi + 1 - i)
    else:
        tile = hi - i
    return tile


@triton.jit
def _segment_stats(x_seg, L, cols, LANES: tl.constexpr, SMOOTH: tl.constexpr, SUB: tl.constexpr,
                   BLOCK: tl.constexpr):
    """(max, sum of exp(x - max), sum of x) of the L columns from x_seg, as pass 1 folds them (the same tiles in
    the same order, without its prefetch)."""
    TILE = BLOCK * SUB
    if LANES:
        m = tl.full([BLOCK], -1e30, tl.float32)
        d = tl.zeros([BLOCK], dtype=tl.float32)
    else:
        m = float("-inf")
        d = 0.0
    sx = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, L, TILE):
        x = tl.load(x_seg + start + cols, mask=start + cols < L, other=float("-inf"))
        m, d, sx = _stats_tile(m, d, sx, x, cols, L - start, LANES, SMOOTH, SUB)
    m_s, d_s = _fold_lanes(m, d, LANES)
    return m_s, d_s, tl.sum(sx, axis=0)


@triton.jit
def _publish(m_s, d_s, sx_s, stat, seg, COUNTER, row):
    """Publish this segment's (max, sum of exp, sum of x) at stat[seg] and count in on the row (release): global
    stores write through to L2, where the partners read (.cg)."""
    tl.store(stat + seg * 3 + 0, m_s)
    tl.store(stat + seg * 3 + 1, d_s)
    tl.store(stat + seg * 3 + 2, sx_s)
    tl.debug_barrier()  # every thread's stores before the release (the CTA barrier, then one gpu-scope release)
    tl.atomic_add(COUNTER + row, 1, sem="release")


@triton.jit
def _wait_row(COUNTER, row, SPIN: tl.constexpr, SPLIT: tl.constexpr):
    """The row's count after polling it (acquire) until all SPLIT segments are in or SPIN polls have passed."""
    arrived = tl.atomic_add(COUNTER + row, 0, sem="acquire")
    spins = arrived * 0  # an int32 scalar from the start (a loop-carried value)
    while (arrived < SPLIT) & (spins < SPIN):
        arrived = tl.atomic_add(COUNTER + row, 0, sem="acquire")
        spins += 1
    tl.debug_barrier()
    return arrived


@triton.jit
def _published(stat, SPLIT: tl.constexpr):
    """The SPLIT segments' published (max, sum of exp, sum of x), in segment order."""
    segs = tl.arange(0, SPLIT)
    return (tl.load(stat + segs * 3 + 0, cache_modifier=".cg"), tl.load(stat + segs * 3 + 1, cache_modifier=".cg"),
            tl.load(stat + segs * 3 + 2, cache_modifier=".cg"))


@triton.jit
def _split_row_loss(m, d, sx, x_target, x_row, row, seg, STATS, COUNTER, V, smoothing, cols, SPIN: tl.constexpr,
                    LANES: tl.constexpr, SMOOTH: tl.constexpr, SUB: tl.constexpr, SPLIT: tl.constexpr,
                    BLOCK: tl.constexpr):
    """(lse, loss) of a row split over SPLIT programs: publish this segment's (max, sum of exp, sum of x), count in
    (release), poll the row's count (acquire) up to SPIN times, then combine the SPLIT segments in segment order,
    the same in every program. A program that finds the row incomplete after SPIN polls (always the earlier
    programs on the interpreter, which runs programs one after another; on a GPU a partner not resident)
    computes every segment's statistics from the logits itself, with pass 1's folding: the same values."""
    m_s, d_s = _fold_lanes(m, d, LANES)
    stat = STATS + row * (SPLIT * 3)  # N SPLIT 3 < 2**31
    _publish(m_s, d_s, tl.sum(sx, axis=0), stat, seg, COUNTER, row)
    arrived = _wait_row(COUNTER, row, SPIN, SPLIT)
    if arrived < SPLIT:
        segs = tl.arange(0, SPLIT)
        seg_w = tl.cdiv(tl.cdiv(V, BLOCK * SUB), SPLIT) * (BLOCK * SUB)
        m_all = tl.full([SPLIT], -1e30, tl.float32)
        d_all = tl.zeros([SPLIT], dtype=tl.float32)
        sx_all = tl.zeros([SPLIT], dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            ms, ds, sxs = _segment_stats(x_row + s * seg_w, tl.minimum(V - s * seg_w, seg_w), cols, LANES, SMOOTH,
                                         SUB, BLOCK)
            m_all = tl.where(segs == s, ms, m_all)
            d_all = tl.where(segs == s, ds, d_all)
            sx_all = tl.where(segs == s, sxs, sx_all)
    else:
        m_all, d_all, sx_all = _published(stat, SPLIT)
    return _row_loss(m_all, d_all, sx_all, x_target, smoothing, V, True, SMOOTH)


@triton.jit
def _ce_persistent_kernel(
    X, stride_x,    # logits, row stride in elements (unit column stride)
    DX, stride_dx,  # dlogits (may be X itself: a tile is in registers before its gradient overwrites it)
    TARGET, LOSS_ROWS,
    N_VALID,        # [1] fp32 non-ignored rows (read only for the mean)
    N, V, ignore_index, smoothing,
    MEAN: tl.constexpr, SMOOTH: tl.constexpr, LANES: tl.constexpr, BLOCK: tl.constexpr,
    KEEP: tl.constexpr,  # eviction hint of pass-1 loads ("evict_last" or "")
    DROP: tl.constexpr,  # eviction hint of pass-2 loads and the gradient's stores ("evict_first" or "")
    RNE: tl.constexpr,   # round to nearest bf16 before the store (the interpreter only, see round_bf16_rne)
    SUB: tl.constexpr,   # a tile is SUB x BLOCK columns (bytes in flight), folded into BLOCK lanes (LANES only)
    STORE: tl.constexpr,  # the gradient stores' cache modifier ("" or ".cs", ".cg")
    SPLIT: tl.constexpr,  # programs per row (a power of two), each on its own run of whole tiles
    STATS, COUNTER,       # SPLIT > 1: [N, SPLIT, 3] fp32 segment statistics; [N] int32 zeros, arrivals per row
    SPIN: tl.constexpr,   # SPLIT > 1: polls of COUNTER before a program computes the other segments itself
    ORDER: tl.constexpr = 0,  # pass 2's order of the re-read tiles (_reread_tile: ORDER_REVERSE, ...)
    HEAD: tl.constexpr = 0,   # 1: tile 0 stays in registers from pass 1 to pass 2 (its gradient written last)
    TAIL_DROP: tl.constexpr = 0,  # 1: pass 1 loads the row's last tile (kept in registers) with DROP, not KEEP
):
    pid = tl.program_id(0)
    cols = _tile_offsets(BLOCK, SUB)
    TILE = BLOCK * SUB
    if SPLIT == 1:
        first = pid
        step = tl.num_programs(0)  # the launcher keeps it <= N, so every program has a first row
        c0 = 0                     # this program's first column of every row, and its number of columns
        L = V
    else:
        first = pid // SPLIT
        step = tl.num_programs(0) // SPLIT  # the launcher makes the grid a multiple of SPLIT, <= N SPLIT
        seg_w = tl.cdiv(tl.cdiv(V, TILE), SPLIT) * TILE
        c0 = (pid % SPLIT) * seg_w
        L = tl.minimum(V - c0, seg_w)  # >= 1: the launcher sees to it
    n_tiles = tl.cdiv(L, TILE)
    scale, off_s, hit_s = _grad_weights(N_VALID, smoothing, V, MEAN)
    # tile 0's hint: with HEAD it is never read again from L2 (it stays in registers)
    if HEAD:
        FIRST: tl.constexpr = DROP
    else:
        FIRST: tl.constexpr = KEEP

    # The first row's first tile; afterwards each row's last load fetches the next row's first tile.
    t_next = tl.load(TARGET + first)
    x_row = X + first.to(tl.int64) * stride_x + c0  # 64-bit row offsets, advanced by step rows each iteration
    dx_row = DX + first.to(tl.int64) * stride_dx + c0
    x_step = step.to(tl.int64) * stride_x
    dx_step = step.to(tl.int64) * stride_dx
    x = tl.load(x_row + cols, mask=cols < tl.where(t_next != ignore_index, L, 0), other=float("-inf"),
                eviction_policy=FIRST)
    for row in range(first, N, step):
        target = t_next
        nrow = row + step
        t_next = tl.load(TARGET + nrow, mask=nrow < N, other=ignore_index)
        next_len = tl.where(t_next != ignore_index, L, 0)  # columns to fetch of the next row (masked past N)
        x_nrow = x_row + x_step
        if target == ignore_index:
            for start in range(0, L, TILE):
                _store_tile(dx_row + start + cols, tl.zeros(cols.shape, dtype=DX.dtype.element_ty), start + cols < L,
                            DROP, STORE)
            if c0 == 0:
                tl.store(LOSS_ROWS + row, 0.0)
            x = tl.load(x_nrow + cols, mask=cols < next_len, other=float("-inf"), eviction_policy=FIRST)
        else:
            in_row = (target >= 0) & (target < V)
            # Read before any store of this row (in place, the target's column is overwritten in pass 2); the
            # reductions ending pass 1 are barriers, so every warp has its value before any warp stores. With
            # SPLIT every segment reads it (no SPLIT in place: the launcher refuses it).
            x_target = tl.load(x_row - c0 + target, mask=in_row, other=0.0).to(tl.float32)
            if LANES:
                m = tl.full([BLOCK], -1e30, tl.float32)  # finite: -inf - -inf would poison a lane
                d = tl.zeros([BLOCK], dtype=tl.float32)
            else:
                m = float("-inf")
                d = 0.0
            sx = tl.zeros([BLOCK], dtype=tl.float32)
            x_head = x  # tile 0, read by pass 2 only without HEAD (then the compiler drops it)
            # pass 1: tiles 0 .. n-1 in order; tile t + 1 is in flight while tile t is reduced. With TAIL_DROP
            # the last tile's load (the last step, peeled) takes DROP: pass 2 reads it from registers.
            for t in range(0, n_tiles - 1 - TAIL_DROP):
                start = (t + 1) * TILE
                x_ahead = tl.load(x_row + start + cols, mask=start + cols < L, other=float("-inf"),
                                  eviction_policy=KEEP)
                m, d, sx = _stats_tile(m, d, sx, x, cols, L - t * TILE, LANES, SMOOTH, SUB)
                x = x_ahead
            if TAIL_DROP:
                if n_tiles > 1:
                    start = (n_tiles - 1) * TILE
                    x_ahead = tl.load(x_row + start + cols, mask=start + cols < L, other=float("-inf"),
                                      eviction_policy=DROP)
                    m, d, sx = _stats_tile(m, d, sx, x, cols, L - start + TILE, LANES, SMOOTH, SUB)
                    x = x_ahead
            last = (n_tiles - 1) * TILE
            m, d, sx = _stats_tile(m, d, sx, x, cols, L - last, LANES, SMOOTH, SUB)
            if SPLIT == 1:
                lse, loss = _row_loss(m, d, sx, x_target, smoothing, V, LANES, SMOOTH)
            else:
                lse, loss = _split_row_loss(m, d, sx, x_target, x_row - c0, row, pid % SPLIT, STATS, COUNTER, V,
                                            smoothing, cols, SPIN, LANES, SMOOTH, SUB, SPLIT, BLOCK)
            if c0 == 0:
                tl.store(LOSS_ROWS + row, loss)
            lse2 = lse * LOG2E
            # pass 2: x holds tile n-1 already; then the tiles lo .. n-2 again in ORDER (by default n-2 .. 0), the
            # next one in flight while one is written; the last load fetches the next row's first tile. With HEAD
            # (and more than one tile) tile 0 is still in registers: lo = 1, and its gradient is written last.
            lo = tl.maximum(tl.minimum(HEAD, n_tiles - 1), 0)  # n_tiles is 0 for a segment with no column
            cur = tl.maximum(n_tiles - 1, 0)
            for i in range(0, n_tiles - 1 - lo):
                nxt = _reread_tile(i, lo, n_tiles - 2, ORDER)
                x_ahead = tl.load(x_row + nxt * TILE + cols, eviction_policy=DROP)  # a whole tile (not the last)
                start = cur * TILE
                _grad_tile(x, dx_row + start, cols, L - start, target - c0 - start, lse2, scale, off_s, hit_s, DROP,
                           RNE, STORE)
                x = x_ahead
                cur = nxt
            x_ahead = tl.load(x_nrow + cols, mask=cols < next_len, other=float("-inf"), eviction_policy=FIRST)
            start = cur * TILE
            _grad_tile(x, dx_row + start, cols, L - start, target - c0 - start, lse2, scale, off_s, hit_s, DROP,
                       RNE, STORE)
            if HEAD:  # tile 0 from registers; nothing to write where it was the only tile (lo = 0: written above)
                _grad_tile(x_head, dx_row, cols, tl.where(lo > 0, L, 0), target - c0, lse2, scale, off_s, hit_s,
                           DROP, RNE, STORE)
            x = x_ahead
        x_row = x_nrow
        dx_row += dx_step


# ---- SMEM (Gluon: explicit shared memory) ---------------------------------------------------------------------
# cp.async global -> shared: async_copy_global_to_shared in Triton 3.6 (the H200's), renamed async_load later
# (3.9 here, where the old name raises)
if "async_load" in dir(async_copy):
    cp_async_to_shared = async_copy.async_load
else:  # Triton 3.6
    cp_async_to_shared = async_copy.async_copy_global_to_shared


@gluon.jit
def _smem_grad_tile(x, cols, dx_ptrs, limit, tgt, lse2, scale, off_s, hit_s, DROP: gl.constexpr):
    """_grad_tile of the persistent form: dx = scale (exp(x - lse) - eps / V) - scale (1 - eps) [col == target]."""
    dx = gl.exp2(x.to(gl.float32) * LOG2E - lse2) * scale - off_s
    dx = gl.where(cols == tgt, dx - hit_s, dx)
    gl.store(dx_ptrs + cols, dx.to(dx_ptrs.dtype.element_ty), mask=cols < limit, eviction_policy=DROP)


@gluon.jit
def _smem_fold(m, d, sx, x, cols, limit, SMOOTH: gl.constexpr):
    """_stats_tile of the persistent form with SUB > 1: a lane's max of its SUB values, one exponential each and
    one rescale; the sum of the logits with label smoothing."""
    xf = x.to(gl.float32)
    m_new = gl.maximum(m, gl.max(xf, axis=0))
    d = d * gl.exp2((m - m_new) * LOG2E) + gl.sum(gl.exp2((xf - gl.expand_dims(m_new, 0)) * LOG2E), axis=0)
    if SMOOTH:
        sx += gl.sum(gl.where(cols < limit, xf, 0.0), axis=0)
    return m_new, d, sx


@gluon.jit
def _smem_issue_kept(kept, x_row, cols, row_len, n_kept, TILE: gl.constexpr, DROP: gl.constexpr):
    """ASYNC: cp.async copies of a row's tiles 0 .. n_kept - 1 straight into shared memory (no registers), one
    commit group; row_len 0 (an ignored row, or none) copies nothing (the slots get zeros, never read)."""
    for t in range(0, n_kept):
        cp_async_to_shared(kept.index(t), x_row + t * TILE + cols, mask=cols < row_len - t * TILE,
                           eviction_policy=DROP)
    async_copy.commit_group()


@gluon.jit
def _ce_smem_kernel(
    X, stride_x, DX, stride_dx, TARGET, LOSS_ROWS, N_VALID, N, V, ignore_index, smoothing,
    MEAN: gl.constexpr, SMOOTH: gl.constexpr, BLOCK: gl.constexpr, SUB: gl.constexpr,
    KEPT: gl.constexpr,   # tiles 0 .. KEPT - 1 of a row stay in shared memory from pass 1 to pass 2
    WARPS: gl.constexpr,  # the launch's num_warps (the layout is explicit)
    KEEP: gl.constexpr, DROP: gl.constexpr,
    ASYNC: gl.constexpr = False,  # the kept tiles arrive by cp.async, issued during the previous row's pass 2
):
    """SMEM: the persistent form's rows and per-lane statistics (one program per multiprocessor, SUB x BLOCK tiles
    folded into BLOCK lanes, tile t + 1 in flight while tile t is reduced), written in Gluon so that the row's
    first KEPT tiles can be held in shared memory (KEPT x SUB x BLOCK x 2 bytes: 192 KB at 6 x 16384 bf16 columns,
    of the 227 KB a block may use) and its last tile in registers: pass 2 reads again from global memory only the
    tiles between (one at 8192 x 128256, the most recently loaded, the likeliest still in L2), so the logits cross
    HBM about once (4.2 GB) where the persistent form's re-reads miss L2 (1.332 ms, 0.996 with both reads
    in L2). Each thread reads back from shared memory exactly the elements it stored (one layout for both), so
    no barrier orders them. Without ASYNC the kept tiles pass through registers in pass 1 (32 KB in flight per
    program, as PERSISTENT); with ASYNC they are copied global -> shared by cp.async (KEPT tiles in flight at
    once): pass 2 issues the next row's copy of tile t as soon as it has read tile t, and the next row's pass 1
    waits for them all (cp.async.wait_group 0) before folding them from shared memory; the tiles from KEPT on
    come through registers as before. Not in place; the interpreter cannot run Gluon (a CUDA launch only)."""
    layout: gl.constexpr = gl.BlockedLayout([SUB, 8], [1, 32], [1, WARPS], [1, 0])
    lanes_l: gl.constexpr = gl.SliceLayout(0, layout)
    TILE: gl.constexpr = SUB * BLOCK
    cols = gl.expand_dims(gl.arange(0, SUB, layout=gl.SliceLayout(1, layout)), 1) * BLOCK \
        + gl.expand_dims(gl.arange(0, BLOCK, layout=lanes_l), 0)
    kept = gl.allocate_shared_memory(X.dtype.element_ty, [KEPT, SUB, BLOCK], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    pid = gl.program_id(0)
    step = gl.num_programs(0)
    if MEAN:
        scale = 1.0 / gl.load(N_VALID)
    else:
        scale = 1.0
    off_s = scale * smoothing / V
    hit_s = scale * (1.0 - smoothing)
    n_tiles = gl.cdiv(V, TILE)
    in_smem = gl.minimum(n_tiles - 1, KEPT)  # tiles 0 .. in_smem - 1 in shared memory; the last in registers
    if ASYNC:
        first_reg = in_smem  # the first tile that comes through registers
    else:
        first_reg = 0

    t_next = gl.load(TARGET + pid)
    x_row = X + pid.to(gl.int64) * stride_x
    dx_row = DX + pid.to(gl.int64) * stride_dx
    x_step = step.to(gl.int64) * stride_x
    dx_step = step.to(gl.int64) * stride_dx
    first_len = gl.where(t_next != ignore_index, V, 0)
    if ASYNC:
        _smem_issue_kept(kept, x_row, cols, first_len, in_smem, TILE, DROP)
    x = gl.load(x_row + first_reg * TILE + cols, mask=cols < first_len - first_reg * TILE, other=float("-inf"),
                eviction_policy=KEEP)
    for row in range(pid, N, step):
        target = t_next
        nrow = row + step
        t_next = gl.load(TARGET + nrow, mask=nrow < N, other=ignore_index)
        next_len = gl.where(t_next != ignore_index, V, 0)
        x_nrow = x_row + x_step
        if target == ignore_index:
            for start in range(0, V, TILE):
                gl.store(dx_row + start + cols, gl.zeros([SUB, BLOCK], DX.dtype.element_ty, layout),
                         mask=start + cols < V, eviction_policy=DROP)
            gl.store(LOSS_ROWS + row, 0.0)
            if ASYNC:
                async_copy.wait_group(0)  # this row's (empty) copies land before the next row's take the slots
                _smem_issue_kept(kept, x_nrow, cols, next_len, in_smem, TILE, DROP)
            x = gl.load(x_nrow + first_reg * TILE + cols, mask=cols < next_len - first_reg * TILE,
                        other=float("-inf"), eviction_policy=KEEP)
        else:
            in_row = (target >= 0) & (target < V)
            x_target = gl.load(x_row + target, mask=in_row, other=0.0).to(gl.float32)
            m = gl.full([BLOCK], -1e30, gl.float32, lanes_l)
            d = gl.zeros([BLOCK], gl.float32, lanes_l)
            sx = gl.zeros([BLOCK], gl.float32, lanes_l)
            if ASYNC:  # the kept tiles, copied while the previous row was written; x (tile in_smem) in flight
                async_copy.wait_group(0)
                for t in range(0, in_smem):
                    m, d, sx = _smem_fold(m, d, sx, kept.index(t).load(layout), cols, V - t * TILE, SMOOTH)
            # pass 1: tile t + 1 in flight while tile t is folded into the lanes (and kept, t < in_smem)
            for t in range(first_reg, n_tiles - 1):
                start = (t + 1) * TILE
                x_ahead = gl.load(x_row + start + cols, mask=start + cols < V, other=float("-inf"),
                                  eviction_policy=KEEP)
                if not ASYNC:
                    if t < in_smem:
                        kept.index(t).store(x)
                m, d, sx = _smem_fold(m, d, sx, x, cols, V - t * TILE, SMOOTH)
                x = x_ahead
            m, d, sx = _smem_fold(m, d, sx, x, cols, V - (n_tiles - 1) * TILE, SMOOTH)  # x: the last tile
            m_row = gl.max(m, axis=0)
            d_row = gl.sum(d * gl.exp2((m - m_row) * LOG2E), axis=0)
            lse = m_row + gl.log(d_row)
            loss = lse - x_target
            if SMOOTH:
                loss = (1.0 - smoothing) * loss + smoothing * (lse - gl.sum(sx, axis=0) / V)
            gl.store(LOSS_ROWS + row, loss)
            lse2 = lse * LOG2E
            tgt = target
            # pass 2: the last tile (registers), tiles n-2 .. in_smem from global memory (in reverse, one in flight),
            # then tiles in_smem - 1 .. 0 from shared memory (ASYNC: each slot refilled with the next row's tile
            # once read); the next row's first register tile is loaded before them
            cur = n_tiles - 1
            for i in range(0, n_tiles - 1 - in_smem):
                nxt = n_tiles - 2 - i
                x_ahead = gl.load(x_row + nxt * TILE + cols, eviction_policy=DROP)  # a whole tile
                _smem_grad_tile(x, cols, dx_row + cur * TILE, V - cur * TILE, tgt - cur * TILE, lse2, scale, off_s,
                                hit_s, DROP)
                x = x_ahead
                cur = nxt
            x_ahead = gl.load(x_nrow + first_reg * TILE + cols, mask=cols < next_len - first_reg * TILE,
                              other=float("-inf"), eviction_policy=KEEP)
            _smem_grad_tile(x, cols, dx_row + cur * TILE, V - cur * TILE, tgt - cur * TILE, lse2, scale, off_s,
                            hit_s, DROP)
            for i in range(0, in_smem):
                t = in_smem - 1 - i
                _smem_grad_tile(kept.index(t).load(layout), cols, dx_row + t * TILE, V - t * TILE, tgt - t * TILE,
                                lse2, scale, off_s, hit_s, DROP)
                if ASYNC:
                    cp_async_to_shared(kept.index(t), x_nrow + t * TILE + cols, mask=cols < next_len - t * TILE,
                                       eviction_policy=DROP)
            if ASYNC:
                async_copy.commit_group()
            x = x_ahead
        x_row = x_nrow
        dx_row += dx_step
    if ASYNC:
        async_copy.wait_group(0)  # the last copies (of no row: masked) land before the program ends


# ---- RESIDENT ---------------------------------------------------------------------------------------------------
@triton.jit
def _resident_stats(x, in_seg, SMOOTH: tl.constexpr):
    """(max, sum of exp(x - max), sum of x) of a segment held whole in registers ([R, BLOCK], -inf past its end).
    The max is kept finite (-1e30 for a segment with no column), so combining segments never forms -inf - -inf."""
    xf = x.to(tl.float32)
    m = tl.maximum(tl.max(tl.max(xf, axis=1), axis=0), -1e30)
    d = tl.sum(tl.sum(tl.exp2((xf - m) * LOG2E), axis=1), axis=0)
    if SMOOTH:
        sx = tl.sum(tl.sum(tl.where(in_seg, xf, 0.0), axis=1), axis=0)
    else:
        sx = 0.0
    return m, d, sx


@triton.jit
def _ce_resident_kernel(
    X, stride_x, DX, stride_dx, TARGET, LOSS_ROWS, N_VALID, N, V, ignore_index, smoothing,
    STATS, COUNTER,       # [N, SPLIT, 3] fp32 segment statistics; [N] int32 zeros, arrivals per row
    MEAN: tl.constexpr, SMOOTH: tl.constexpr, BLOCK: tl.constexpr,
    R: tl.constexpr,      # a segment is R x BLOCK columns, held in registers from its load to its gradient's store
    SPLIT: tl.constexpr,  # programs per row (R BLOCK SPLIT >= V)
    SPIN: tl.constexpr,   # polls of COUNTER before a program computes its partners' statistics itself
    PREFETCH: tl.constexpr,  # load the next row's segment before waiting for this row's partners
    DROP: tl.constexpr, RNE: tl.constexpr, STORE: tl.constexpr,
):
    """RESIDENT: each row read once. SPLIT programs share a row, each loading its R x BLOCK segment in one load
    and keeping it in registers; they publish their segment's statistics, meet (_wait_row), and write the
    gradient from the registers: 4.2 GB of traffic at 8192 x 128256 bf16, where PERSISTENT's second read of
    each row (from L2 where it still is) moves up to 6.3. With PREFETCH the next row's segment is in flight
    while the program waits for its partners (twice the registers). Programs pid, pid + 1, ... of a group of
    SPLIT take the same rows; a program that finds its row incomplete after SPIN polls (the interpreter's
    earlier programs; on a GPU a partner not resident) loads the other segments and computes their statistics
    with the same code: the same values, so every program of a row agrees bitwise. Not in place."""
    pid = tl.program_id(0)
    seg = pid % SPLIT
    first = pid // SPLIT
    step = tl.num_programs(0) // SPLIT  # the launcher makes the grid a multiple of SPLIT, <= N SPLIT
    SEG_W: tl.constexpr = R * BLOCK
    cols = tl.arange(0, R)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    c0 = seg * SEG_W
    in_seg = cols < V - c0  # nothing for a segment past the row's end
    scale, off_s, hit_s = _grad_weights(N_VALID, smoothing, V, MEAN)
    t_next = tl.load(TARGET + first)
    x_row = X + first.to(tl.int64) * stride_x  # 64-bit row offsets, advanced by step rows each iteration
    dx_row = DX + first.to(tl.int64) * stride_dx + c0
    x_step = step.to(tl.int64) * stride_x
    dx_step = step.to(tl.int64) * stride_dx
    x = tl.load(x_row + c0 + cols, mask=cols < tl.where(t_next != ignore_index, V - c0, 0), other=float("-inf"))
    for row in range(first, N, step):
        target = t_next
        nrow = row + step
        t_next = tl.load(TARGET + nrow, mask=nrow < N, other=ignore_index)
        x_nrow = x_row + x_step
        next_mask = cols < tl.where(t_next != ignore_index, V - c0, 0)  # the next row's (none past N or ignored)
        if target == ignore_index:
            _store_tile(dx_row + cols, tl.zeros(cols.shape, dtype=DX.dtype.element_ty), in_seg, DROP, STORE)
            if seg == 0:
                tl.store(LOSS_ROWS + row, 0.0)
            x = tl.load(x_nrow + c0 + cols, mask=next_mask, other=float("-inf"))
        else:
            in_row = (target >= 0) & (target < V)
            x_target = tl.load(x_row + target, mask=in_row, other=0.0).to(tl.float32)
            m_s, d_s, sx_s = _resident_stats(x, in_seg, SMOOTH)
            stat = STATS + row * (SPLIT * 3)  # N SPLIT 3 < 2**31
            _publish(m_s, d_s, sx_s, stat, seg, COUNTER, row)
            if PREFETCH:
                x_ahead = tl.load(x_nrow + c0 + cols, mask=next_mask, other=float("-inf"))
            arrived = _wait_row(COUNTER, row, SPIN, SPLIT)
            segs = tl.arange(0, SPLIT)
            if arrived < SPLIT:
                m_all = tl.full([SPLIT], -1e30, tl.float32)
                d_all = tl.zeros([SPLIT], dtype=tl.float32)
                sx_all = tl.zeros([SPLIT], dtype=tl.float32)
                for s in tl.static_range(SPLIT):
                    s_in = cols < V - s * SEG_W
                    xs = tl.load(x_row + s * SEG_W + cols, mask=s_in, other=float("-inf"))
                    ms, ds, sxs = _resident_stats(xs, s_in, SMOOTH)
                    m_all = tl.where(segs == s, ms, m_all)
                    d_all = tl.where(segs == s, ds, d_all)
                    sx_all = tl.where(segs == s, sxs, sx_all)
            else:
                m_all, d_all, sx_all = _published(stat, SPLIT)
            lse, loss = _row_loss(m_all, d_all, sx_all, x_target, smoothing, V, True, SMOOTH)
            if seg == 0:
                tl.store(LOSS_ROWS + row, loss)
            _grad_tile(x, dx_row, cols, V - c0, target - c0, lse * LOG2E, scale, off_s, hit_s, DROP, RNE, STORE)
            if PREFETCH:
                x = x_ahead
            else:
                x = tl.load(x_nrow + c0 + cols, mask=next_mask, other=float("-inf"))
        x_row = x_nrow
        dx_row += dx_step


# ---- STAGED -----------------------------------------------------------------------------------------------------
@triton.jit
def _ce_staged_kernel(
    X, stride_x, DX, stride_dx, TARGET, LOSS_ROWS, N_VALID, N, V, ignore_index, smoothing,
    MEAN: tl.constexpr, SMOOTH: tl.constexpr, LANES: tl.constexpr, BLOCK: tl.constexpr,
    STAGES: tl.constexpr,  # num_stages of both tile loops: STAGES - 1 tiles in flight (cp.async into shared memory)
    KEEP: tl.constexpr, DROP: tl.constexpr, RNE: tl.constexpr, STORE: tl.constexpr,
):
    """The PERSISTENT form's rows and maths, with Triton's software pipeliner in place of the hand-written one:
    each pass is a plain tile loop under tl.range(num_stages=STAGES), which on sm_90 turns the loads into
    cp.async copies STAGES - 1 tiles ahead (the hand-written form has one tile in flight, held in registers). No
    prefetch across passes or rows, so each pass starts with an empty pipeline; the grid (programs) can cover that
    with two programs per multiprocessor. In place is safe: a tile's gradient is stored after its own load, and the
    loads in flight are of other tiles of the same pass."""
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    n_tiles = tl.cdiv(V, BLOCK)
    scale, off_s, hit_s = _grad_weights(N_VALID, smoothing, V, MEAN)
    x_row = X + pid.to(tl.int64) * stride_x  # 64-bit row offsets, advanced by step rows each iteration
    dx_row = DX + pid.to(tl.int64) * stride_dx
    x_step = step.to(tl.int64) * stride_x
    dx_step = step.to(tl.int64) * stride_dx
    for row in range(pid, N, step):
        target = tl.load(TARGET + row)
        if target == ignore_index:
            for start in range(0, V, BLOCK):
                _store_tile(dx_row + start + cols, tl.zeros([BLOCK], dtype=DX.dtype.element_ty), start + cols < V,
                            DROP, STORE)
            tl.store(LOSS_ROWS + row, 0.0)
        else:
            in_row = (target >= 0) & (target < V)
            x_target = tl.load(x_row + target, mask=in_row, other=0.0).to(tl.float32)  # before any store (in place)
            if LANES:
                m = tl.full([BLOCK], -1e30, tl.float32)
                d = tl.zeros([BLOCK], dtype=tl.float32)
            else:
                m = float("-inf")
                d = 0.0
            sx = tl.zeros([BLOCK], dtype=tl.float32)
            for t in tl.range(0, n_tiles, num_stages=STAGES):
                start = t * BLOCK
                x = tl.load(x_row + start + cols, mask=start + cols < V, other=float("-inf"), eviction_policy=KEEP)
                m, d, sx = _stats_tile(m, d, sx, x, cols, V - start, LANES, SMOOTH, 1)
            lse, loss = _row_loss(m, d, sx, x_target, smoothing, V, LANES, SMOOTH)
            tl.store(LOSS_ROWS + row, loss)
            lse2 = lse * LOG2E
            # pass 2 in reverse: the most recently read tiles first (the likeliest still in L2)
            for i in tl.range(0, n_tiles, num_stages=STAGES):
                start = (n_tiles - 1 - i) * BLOCK
                x = tl.load(x_row + start + cols, mask=start + cols < V, other=0.0, eviction_policy=DROP)
                _grad_tile(x, dx_row + start, cols, V - start, target - start, lse2, scale, off_s, hit_s, DROP, RNE,
                           STORE)
        x_row += x_step
        dx_row += dx_step


# ---- TWO_PASS and RENDEZVOUS -------------------------------------------------------------------------------------
@triton.jit
def _ce_segments_kernel(
    X, stride_x,    # logits, row stride in elements (unit column stride)
    DX, stride_dx,  # dlogits (may be X itself: each element is read before it is overwritten)
    TARGET, STATS,  # STATS: [N, SEGMENTS, 4] fp32 (m_s, d_s, sx_s, xt_s)
    COUNTER,        # [N] int32 zeros: FUSED programs that have published, per row
    LOSS_ROWS,      # [N] fp32 per-row loss (written by segment 0)
    N_VALID,        # [1] fp32 non-ignored rows (read only for the mean)
    V, ignore_index, smoothing,
    MEAN: tl.constexpr, MODE: tl.constexpr, SEGMENTS: tl.constexpr, SEG_POW2: tl.constexpr, BLOCK: tl.constexpr,
    RNE: tl.constexpr,  # round to nearest bf16 before the store (the interpreter only, see round_bf16_rne)
):
    pid = tl.program_id(0)
    row = pid // SEGMENTS
    seg = pid % SEGMENTS
    cols = seg * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < V
    target = tl.load(TARGET + row)
    ignored = target == ignore_index
    x_ptrs = X + row.to(tl.int64) * stride_x + cols
    dx_ptrs = DX + row.to(tl.int64) * stride_dx + cols
    stat = STATS + (row.to(tl.int64) * SEGMENTS + seg) * 4

    if ignored:
        if MODE != MODE_STATS:
            tl.store(dx_ptrs, tl.zeros([BLOCK], dtype=DX.dtype.element_ty), mask=in_row)
            if seg == 0:
                tl.store(LOSS_ROWS + row, 0.0)
    else:
        x = tl.load(x_ptrs, mask=in_row, other=float("-inf")).to(tl.float32)
        if MODE != MODE_GRAD:
            m_s = tl.max(x, axis=0)
            d_s = tl.sum(tl.exp(x - m_s), axis=0)
            sx_s = tl.sum(tl.where(in_row, x, 0.0), axis=0)
            xt_s = tl.sum(tl.where(cols == target, x, 0.0), axis=0)
            if MODE == MODE_STATS:
                tl.store(stat + 0, m_s)
                tl.store(stat + 1, d_s)
                tl.store(stat + 2, sx_s)
                tl.store(stat + 3, xt_s)
            else:
                # Publish through L2 (atomics), then count in with release order and wait for the row.
                tl.atomic_xchg(stat + 0, m_s)
                tl.atomic_xchg(stat + 1, d_s)
                tl.atomic_xchg(stat + 2, sx_s)
                tl.atomic_xchg(stat + 3, xt_s)
                tl.debug_barrier()
                tl.atomic_add(COUNTER + row, 1, sem="release")
                arrived = tl.atomic_add(COUNTER + row, 0, sem="acquire")
                while arrived < SEGMENTS:
                    arrived = tl.atomic_add(COUNTER + row, 0, sem="acquire")
        # The row's statistics, combined in segment order (same order in every program: bitwise repeatable).
        segs = tl.arange(0, SEG_POW2)
        sptr = STATS + (row.to(tl.int64) * SEGMENTS + segs) * 4
        smask = segs < SEGMENTS
        if MODE == MODE_FUSED:
            m_all = tl.atomic_add(sptr + 0, tl.zeros([SEG_POW2], dtype=tl.float32), mask=smask)
            d_all = tl.atomic_add(sptr + 1, tl.zeros([SEG_POW2], dtype=tl.float32), mask=smask)
            sx_all = tl.atomic_add(sptr + 2, tl.zeros([SEG_POW2], dtype=tl.float32), mask=smask)
            xt_all = tl.atomic_add(sptr + 3, tl.zeros([SEG_POW2], dtype=tl.float32), mask=smask)
            m_all = tl.where(smask, m_all, float("-inf"))
            d_all = tl.where(smask, d_all, 0.0)
            sx_all = tl.where(smask, sx_all, 0.0)
            xt_all = tl.where(smask, xt_all, 0.0)
        else:
            m_all = tl.load(sptr + 0, mask=smask, other=float("-inf"))
            d_all = tl.load(sptr + 1, mask=smask, other=0.0)
            sx_all = tl.load(sptr + 2, mask=smask, other=0.0)
            xt_all = tl.load(sptr + 3, mask=smask, other=0.0)
        if MODE != MODE_STATS:
            m = tl.max(m_all, axis=0)
            lse = m + tl.log(tl.sum(tl.where(smask, d_all * tl.exp(m_all - m), 0.0), axis=0))
            x_target = tl.sum(xt_all, axis=0)
            if MEAN:
                scale = 1.0 / tl.load(N_VALID)
            else:
                scale = 1.0
            if seg == 0:
                loss = (1.0 - smoothing) * (lse - x_target) + smoothing * (lse - tl.sum(sx_all, axis=0) / V)
                tl.store(LOSS_ROWS + row, loss)
            dx = (tl.exp(x - lse) - smoothing / V - tl.where(cols == target, 1.0 - smoothing, 0.0)) * scale
            if RNE:
                dx = round_bf16_rne(dx)
            tl.store(dx_ptrs, dx.to(DX.dtype.element_ty), mask=in_row)



@triton.jit
def _sum_rows_kernel(LOSS_ROWS, N, N_VALID, OUT, MEAN: tl.constexpr, BLOCK: tl.constexpr):
    """OUT[0] = sum of the per-row losses (divided by n_valid for the mean), one program, fixed order."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(LOSS_ROWS + offs, mask=offs < N, other=0.0)
    total = tl.sum(acc, axis=0)
    if MEAN:
        total = total / tl.load(N_VALID)
    tl.store(OUT, total)


def _check(logits: torch.Tensor, target: torch.Tensor, reduction: str, label_smoothing: float) -> None:
    if logits.dim() != 2 or target.dim() != 1 or target.shape[0] != logits.shape[0]:
        raise ValueError(f"cross_entropy: expected logits [N, V] and target [N], got {tuple(logits.shape)} and "
                         f"{tuple(target.shape)}")
    if not logits.is_floating_point() or target.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"cross_entropy: expected float logits and int64/int32 targets, got {logits.dtype} and "
                         f"{target.dtype}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"cross_entropy: reduction must be 'mean' or 'sum', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must lie in [0, 1], got {label_smoothing}")


def ce_block(v: int, device: torch.device, form: str = DEFAULT_FORM) -> tuple[int, int]:
    """Columns per tile and warps.
    PERSISTENT on a GPU: 8192 columns at 16 warps, 16 columns a thread (109-113 registers for sm_90 with LANES, no
    spills), one 512-thread program per multiprocessor. Measured on the H200 (bench_ce.py, Triton 3.6, 132
    programs): with LANES 1.494 ms, the best of the sweep; without LANES 1.793 at 8192/16, 1.541 at 16384/16,
    2.175 at 4096/8 (1.660 with 264 programs); one program per row: 1.498 at 16384/16, 1.893 at 32768/32, 1.913
    at 8192/8.
    TWO_PASS on a GPU: 8192 columns at 8 warps, a 128k-vocabulary row in 16 programs (2.209 ms in the same run;
    earlier 2.22 against 2.27 at 16384/8 warps, 3.04 at 16384/16). The interpreter: 2048, where wide blocks only
    cost time."""
    if device.type != "cuda":
        cap, warps = 2048, 4
    elif form in ("persistent", "staged", "resident", "smem"):
        cap, warps = 8192, 16
    else:
        cap, warps = 8192, 8
    block = min(cap, max(16, triton.next_power_of_2(v)))
    return block, max(4, min(warps, block // 256 if form in ("persistent", "staged", "resident", "smem")
                             else block // 2048))


def ce_rows(logits: torch.Tensor, target: torch.Tensor, dlogits: torch.Tensor, loss_rows: torch.Tensor,
            n_valid: torch.Tensor, ignore_index: int, label_smoothing: float, mean: bool,
            fused: bool | None = None, block: int | None = None, num_warps: int | None = None,
            form: str | None = None, programs: int | None = None, lanes: bool = True, hints: bool = True,
            stages: int = 3, sub: int | None = None, store_cache: str = "", split: int | None = None,
            prefetch: bool = True, order: str = "reverse", head: bool = False, tail_drop: bool = False,
            kept: int | None = None, async_kept: bool = False) -> None:
    """Per-row losses into `loss_rows` and the gradient into `dlogits` (which may be `logits` itself).
    form: "persistent" (default), "staged", "two_pass" or "rendezvous"; `fused` is the older switch (True:
    rendezvous, False: two_pass) and is read only when form is None, so fused=None gives the persistent form.
    Persistent and staged: programs (default: one per multiprocessor; N gives one program per row), lanes
    (per-lane running max/sum, default on: the H200's best), hints (L2 eviction hints), store_cache (the gradient
    stores' cache modifier: "" (default), ".cs" streaming, ".cg" L2 only). Staged only: stages (the tile loops'
    num_stages). Persistent with lanes only: sub (default 2 on a GPU where a row holds two tiles, else 1,
    benchmarks/sweep_ce.py at 8192 x 128256: 1.331 ms against 1.494 with 1, 1.335 at sub 4), tiles of sub x block
    columns folded into `block` lanes: sub times the bytes in flight per program (one tile is loaded ahead) for the same per-lane state; and,
    not in place, split (default 1): programs per row (a power of two), each on 1/split of the row's tiles, that
    meet once per row to combine their statistics: the live rows take 1/split of the L2 for the same grid.
    Resident: split programs per row (default 4 on a GPU), each holding its share of the row in registers as
    one tile of R x block columns (R the power of two that covers 1/split of the row); prefetch (default on)
    loads the next row's share before waiting for the partners. Not in place.
    Persistent only, pass 2's re-reads (benchmarks/sweep_ce.py --tail): order, the order of the re-read tiles
    ("reverse", the default: the most recent first; "forward"; "oldest_first": tile 0, then the rest in
    reverse); head (default off): tile 0 stays in registers from pass 1 to the end of pass 2 (one more tile of
    registers), so the tile read longest ago, the likeliest to have left L2, is not re-read; tail_drop (default
    off): pass 1 loads the row's last tile, which pass 2 takes from registers, with evict_first instead of
    evict_last (with head, tile 0 is loaded so too), so no L2 line is held back for a tile nobody re-reads.
    Smem (Gluon, a CUDA launch only, not in place): the persistent form's rows with the first `kept` tiles of
    each row held in shared memory (default: as many as fit the device's per-block limit, less 4 KB, and at
    most all but the last tile), so pass 2 re-reads from global memory only the tiles between them and the
    last; block, num_warps, sub (default 2) and hints as for the persistent form; async_kept (default off): the
    kept tiles are copied global -> shared by cp.async, issued during the previous row's pass 2."""
    n, v = logits.shape
    if n == 0:
        return
    if form is None:
        form = DEFAULT_FORM if fused is None else ("rendezvous" if fused else "two_pass")
    if form not in FORMS:
        raise ValueError(f"cross_entropy: form must be one of {', '.join(FORMS)}, got {form!r}")
    blk, warps = ce_block(v, logits.device, form)
    blk, warps = block or blk, num_warps or warps
    if sub is None:
        sub = 2 if logits.is_cuda and form in ("persistent", "smem") and lanes and v >= 2 * blk else 1
    if sub < 1 or sub & (sub - 1):
        raise ValueError(f"cross_entropy: sub must be a power of two >= 1, got {sub}")
    if sub > 1 and (form not in ("persistent", "smem") or not lanes):
        raise ValueError("cross_entropy: sub > 1 needs the persistent (or smem) form with lanes")
    if split is None:
        split = (4 if logits.is_cuda else 2) if form == "resident" else 1
    if split < 1 or split & (split - 1):
        raise ValueError(f"cross_entropy: split must be a power of two >= 1, got {split}")
    if split > 1 and (form not in ("persistent", "resident") or not lanes):
        raise ValueError("cross_entropy: split > 1 needs the persistent or resident form with lanes")
    shared = dlogits.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr()
    if (split > 1 or form == "resident") and shared:
        raise ValueError("cross_entropy: split > 1 (and the resident form) cannot write the gradient over the logits")
    if store_cache not in STORE_CACHE:
        raise ValueError(f"cross_entropy: store_cache must be one of {STORE_CACHE}, got {store_cache!r}")
    if order not in ORDERS:
        raise ValueError(f"cross_entropy: order must be one of {', '.join(ORDERS)}, got {order!r}")
    if (order != "reverse" or head or tail_drop) and form != "persistent":
        raise ValueError("cross_entropy: order, head and tail_drop are options of the persistent form")
    rne = needs_rne(dlogits)
    if (kept is not None or async_kept) and form != "smem":
        raise ValueError("cross_entropy: kept and async_kept are options of the smem form")
    if form == "smem":
        if store_cache or not lanes:
            raise ValueError("cross_entropy: the smem form has per-lane statistics and hinted stores only")
        if not logits.is_cuda:
            raise ValueError("cross_entropy: the smem form is written in Gluon, which only a CUDA device runs")
        if shared:
            raise ValueError("cross_entropy: the smem form cannot write the gradient over the logits")
        tile = sub * blk
        n_tiles = triton.cdiv(v, tile)
        if kept is None:
            props = torch.cuda.get_device_properties(logits.device)
            room = props.shared_memory_per_block_optin - 4096  # 227 KB on sm_90
            kept = room // (tile * logits.element_size())
        kept = max(1, min(kept, n_tiles - 1))
        grid = (max(1, min(n, programs or sm_count(logits.device))),)
        _ce_smem_kernel[grid](
            logits, logits.stride(0), dlogits, dlogits.stride(0), target, loss_rows, n_valid, n, v, ignore_index,
            float(label_smoothing), MEAN=mean, SMOOTH=label_smoothing > 0, BLOCK=blk, SUB=sub, KEPT=kept, WARPS=warps,
            KEEP="evict_last" if hints else "", DROP="evict_first" if hints else "", ASYNC=async_kept, num_warps=warps)
        return
    if form == "resident":
        grid = (max(1, min(n * split, programs or sm_count(logits.device)) // split) * split,)
        r = triton.next_power_of_2(triton.cdiv(triton.cdiv(v, split), blk))
        stats = torch.empty((n, split, 3), dtype=torch.float32, device=logits.device)
        counter = torch.zeros(n, dtype=torch.int32, device=logits.device)
        _ce_resident_kernel[grid](
            logits, logits.stride(0), dlogits, dlogits.stride(0), target, loss_rows, n_valid, n, v, ignore_index,
            float(label_smoothing), stats, counter, MEAN=mean, SMOOTH=label_smoothing > 0, BLOCK=blk, R=r,
            SPLIT=split, SPIN=1 << 14 if logits.is_cuda else 0, PREFETCH=prefetch,
            DROP="evict_first" if hints else "", RNE=rne, STORE=store_cache, num_warps=warps)
        return
    if form in ("persistent", "staged"):
        grid = (max(1, min(n * split, programs or sm_count(logits.device)) // split) * split,)
        args = (logits, logits.stride(0), dlogits, dlogits.stride(0), target, loss_rows, n_valid, n, v, ignore_index,
                float(label_smoothing))
        common = dict(MEAN=mean, SMOOTH=label_smoothing > 0, LANES=lanes, BLOCK=blk,
                      KEEP="evict_last" if hints else "", DROP="evict_first" if hints else "", RNE=rne,
                      STORE=store_cache, num_warps=warps)
        if form == "persistent":
            if split > 1:
                stats = torch.empty((n, split, 3), dtype=torch.float32, device=logits.device)
                counter = torch.zeros(n, dtype=torch.int32, device=logits.device)
            else:
                stats, counter = loss_rows, n_valid  # not read
            spin = 1 << 14 if logits.device.type == "cuda" else 0
            _ce_persistent_kernel[grid](*args, SUB=sub, SPLIT=split, STATS=stats, COUNTER=counter, SPIN=spin,
                                        ORDER=ORDERS.index(order), HEAD=int(head), TAIL_DROP=int(tail_drop), **common)
        else:
            _ce_staged_kernel[grid](*args, STAGES=stages, **common)
        return
    segments = triton.cdiv(v, blk)
    stats = torch.empty((n, segments, 4), dtype=torch.float32, device=logits.device)
    counter = torch.zeros((n,) if form == "rendezvous" else (1,), dtype=torch.int32, device=logits.device)
    common = dict(MEAN=mean, SEGMENTS=segments, SEG_POW2=triton.next_power_of_2(segments), BLOCK=blk, RNE=rne,
                  num_warps=warps)
    args = (logits, logits.stride(0), dlogits, dlogits.stride(0), target, stats, counter, loss_rows, n_valid, v,
            ignore_index, float(label_smoothing))
    grid = (n * segments,)
    if form == "rendezvous":
        _ce_segments_kernel[grid](*args, MODE=MODE_FUSED.value, **common)
    else:
        _ce_segments_kernel[grid](*args, MODE=MODE_STATS.value, **common)
        _ce_segments_kernel[grid](*args, MODE=MODE_GRAD.value, **common)


def needs_rne(out: torch.Tensor) -> bool:
    """Whether bf16 stores into `out` need round_bf16_rne first: on the CPU interpreter only."""
    return out.dtype == torch.bfloat16 and out.device.type != "cuda"


def _small_block(n: int) -> tuple[int, int]:
    """One step over up to 8192 entries (a 64 KB int64 target vector in one load, not eight latency-bound ones)."""
    block = min(8192, max(128, triton.next_power_of_2(n)))
    return block, max(4, min(16, block // 512))


def count_valid(target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    out = torch.empty(1, dtype=torch.float32, device=target.device)
    block, warps = _small_block(target.shape[0])
    _count_valid_kernel[(1,)](target, target.shape[0], ignore_index, out, BLOCK=block, num_warps=warps)
    return out


def sum_rows(loss_rows: torch.Tensor, n_valid: torch.Tensor, mean: bool) -> torch.Tensor:
    out = torch.empty((), dtype=torch.float32, device=loss_rows.device)
    block, warps = _small_block(loss_rows.shape[0])
    _sum_rows_kernel[(1,)](loss_rows, loss_rows.shape[0], n_valid, out, MEAN=mean, BLOCK=block, num_warps=warps)
    return out


def cross_entropy_fwd_bwd(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                          label_smoothing: float = 0.0, reduction: str = "mean", fused: bool | None = None,
                          block: int | None = None, num_warps: int | None = None, form: str | None = None,
                          programs: int | None = None, lanes: bool = True, hints: bool = True,
                          out: torch.Tensor | None = None, stages: int = 3, sub: int | None = None,
                          store_cache: str = "", split: int | None = None, prefetch: bool = True,
                          order: str = "reverse", head: bool = False, tail_drop: bool = False,
                          kept: int | None = None, async_kept: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, dlogits) of F.cross_entropy(logits.float(), target, ...) for an upstream gradient of 1.
    out: where dlogits goes (default: a new tensor); `logits` itself writes the gradient in place, for a caller
    that owns the logits buffer. The other keywords choose the kernel (see ce_rows)."""
    _check(logits, target, reduction, label_smoothing)
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    target = target.contiguous()
    mean = reduction == "mean"
    n = logits.shape[0]
    if out is None:
        out = torch.empty_like(logits, memory_format=torch.contiguous_format)
    elif out.shape != logits.shape or out.dtype != logits.dtype or out.stride(-1) != 1:
        raise ValueError(f"cross_entropy: out must be a {tuple(logits.shape)} {logits.dtype} tensor with unit column "
                         "stride")
    loss_rows = torch.empty(n, dtype=torch.float32, device=logits.device)
    n_valid = count_valid(target, ignore_index)
    ce_rows(logits, target, out, loss_rows, n_valid, ignore_index, label_smoothing, mean, fused, block, num_warps,
            form, programs, lanes, hints, stages, sub, store_cache, split, prefetch, order, head, tail_drop,
            kept, async_kept)
    return sum_rows(loss_rows, n_valid, mean), out


def gpu_variant(logits: torch.Tensor) -> dict:
    """The launch measured best on the H200 (benchmarks/sweep_ce.py --tail, 8192 x 128256 bf16, every row
    checked against float64 first): the smem form with cp.async, tiles of 2 x 8192 columns at 16 warps, 1.274 ms,
    against 1.333 for the persistent form (a copy of the logits: 0.988). Used on sm_90 for 16-bit logits of at
    least two such tiles a row (one kept in shared memory, the last in registers) whose rows start 16-byte
    aligned (cp.async copies 16-byte pieces: where Triton cannot prove the alignment, an odd row length or
    offset, the copy does not compile: `crucible bench` found it); elsewhere {}: the persistent form, which the
    interpreter runs too."""
    if (not logits.is_cuda or logits.element_size() != 2 or logits.shape[-1] < 2 * 2 * 8192
            or logits.stride(-1) != 1 or logits.stride(0) % 16 or logits.data_ptr() % 16
            or torch.cuda.get_device_capability(logits.device)[0] != 9):
        return {}
    return {"form": "smem", "block": 8192, "num_warps": 16, "sub": 2, "async_kept": True}


class ModelNew(torch.nn.Module):
    """tasks/cross_entropy.py and tasks/cross_entropy_smooth_sum.py: (loss, dlogits)."""

    def __init__(self, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean"):
        super().__init__()
        self.ignore_index, self.label_smoothing, self.reduction = ignore_index, label_smoothing, reduction

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return cross_entropy_fwd_bwd(logits, target, self.ignore_index, self.label_smoothing, self.reduction,
                                     **gpu_variant(logits))
