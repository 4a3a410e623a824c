"""Decode attention (one new query token per sequence) over a long KV cache: split-K flash-decoding, GQA, and a
paged variant that reads K/V through a block table.

Shapes: q [B, Hq, 1, D] (or [B, Hq, D]); a contiguous cache k, v [B, Hkv, N, D], or a paged one
k_cache, v_cache [num_pages, PAGE, Hkv, D] with block_table [B, max_pages] int32 (page ids) and seq_lens [B] int32
(the FlashAttention / vLLM layout); Hq a multiple of Hkv; D a power of two; fp16/bf16 (fp32 with full-precision dots).
Output o [B, Hq, 1, D] (q's shape) = softmax(q k^T / sqrt(D)) v over each sequence's first seq_lens[b] keys.

One query row per head cannot fill a GPU, so the key axis is split: program (b, kv head, split) streams its share of
the cache once for all GROUP query heads of the kv head (the group's queries are the rows of one tl.dot tile, padded
to 16), and leaves an fp32 partial output o_s and its log-sum-exp lse_s. A second kernel combines the splits:
    lse = log sum_s exp(lse_s),   o = sum_s exp(lse_s - lse) o_s            (empty splits have lse_s = -inf)
in a fixed order, so results are bitwise repeatable.
Bytes: the KV read dominates: 2 B Hkv N D elt (2.15 GB at batch 64, Hkv 8, N 8192, D 128, bf16: 0.51 ms at the
copy ceiling of 4,244 GB/s); partials add 2 x B Hq splits (D + 1) x 4 bytes each way (8.4 MB at 8 splits).

Schedules: the split grid (program (b Hkv + kv head, split)), or `balanced` (dense cache, every sequence N keys):
the B Hkv sequences' key tiles laid end to end and cut into equal ranges, one a program (a fixed number an SM), each
program leaving one partial per sequence its range touches, so no wave of programs runs half empty. On sm_90 the
dense cache's whole tiles come through TMA descriptors (`tma`), the partial tail through masked pointer loads.

On the CPU interpreter (Triton 3.9: wrong bf16 tl.dot, truncating fp32 -> bf16) the operands are upcast and bf16
outputs rounded to nearest, as in seeds/attention.py.
Measured on the H200 (benchmarks/sweep_decode.py, do_bench), batch 64, 8k KV, GQA
32/8, D128: every variant within 1% of SDPA enable_gqa, which reads the KV bytes at ~4,400 GB/s (a read-mostly
stream, above the copy ceiling): one split at 64-token tiles, 2 stages 0.4950 ms against SDPA's 0.4932 (0.996x);
TMA or pointers the same (0.4951 / 0.4950); balanced 0.4964-0.4968 (no gain: not the default); the old default
(2 splits, 3 stages) 0.4966-0.5109. `crucible bench` (the defaults here): 0.4838 ms = 4,441 GB/s,
0.995x SDPA [0.992, 1.000], no significant difference: a tie at the bandwidth limit, not a win (the old
default 0.972x, balanced 0.990x). Paged: one split 0.4663 ms, 1.073x SDPA on the gathered cache (0.5003; the
gather itself not timed); `crucible bench` 0.4576 ms, 3.65x the task's eager (gather + SDPA).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

from seeds._common import sm_count
from seeds.attention import _descs, _mm, _operand, _row_view, _tile_pair, _want_tma
from seeds.cross_entropy import store_rounded

CRUCIBLE_SEED = {
    "name": "decode_attention",
    "tasks": ["decode_attention.py"],
    "ops": ["decode attention (split-K flash-decoding, GQA)"],
}


@triton.jit
def _decode_step(q, k, v, ok, m_i, l_i, acc, qk_scale, MASK: tl.constexpr, UPCAST: tl.constexpr,
                 IEEE: tl.constexpr):
    """One key tile folded into the online softmax of the group's query rows (base 2; ok: the tile's valid keys,
    used where MASK). A tile holds at least one valid key, so m_new is finite from the first step on."""
    s = _mm(q, tl.trans(k), tl.zeros([q.shape[0], k.shape[0]], dtype=tl.float32), UPCAST, IEEE) * qk_scale
    if MASK:
        s = tl.where(ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = _mm(_operand(p, v.dtype, UPCAST), v, acc * alpha[:, None], UPCAST, IEEE)
    return m_new, l_i, acc


@triton.jit
def _decode_part(
    Q, K, V, O_PART, LSE_PART, K_DESC, V_DESC, KV_RB, KV_RH, BLOCK_TABLE, qk_scale,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_bt,
    b, hkv, lo, hi, slot, HKV, SLOTS,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr, PAGED: tl.constexpr, TMA: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    """Keys [lo, hi) of (sequence b, kv head hkv) for the GROUP query heads: the partial o_s and lse_s, stored in
    partial slot `slot` of SLOTS. Partials: O_PART [B, Hq, SLOTS, D] and LSE_PART [B, Hq, SLOTS] fp32, base-2
    lse; an empty range (a split past this sequence's length) leaves o_s = 0 and lse_s = -inf."""
    b64 = b.to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    head_ok = heads < GROUP
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    hq = (hkv * GROUP + heads).to(tl.int64)
    q = tl.load(Q + b64 * stride_qb + hq[:, None] * stride_qh + offs_d[None, :], mask=head_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    k_head = K + b64 * stride_kb + hkv.to(tl.int64) * stride_kh
    v_head = V + b64 * stride_vb + hkv.to(tl.int64) * stride_vh
    if PAGED:
        for start in range(lo, hi, BLOCK_N):
            tok = start + offs_n
            ok = tok < hi
            # A BLOCK_N tile spans BLOCK_N / PAGE pages (or part of one): gather each token's row from its page.
            page = tl.load(BLOCK_TABLE + b64 * stride_bt + tok // PAGE, mask=ok, other=0).to(tl.int64)
            k_ptrs = K + hkv.to(tl.int64) * stride_kh + (page * stride_kb + (tok % PAGE) * stride_kn)[:, None] \
                + offs_d[None, :]
            v_ptrs = V + hkv.to(tl.int64) * stride_vh + (page * stride_vb + (tok % PAGE) * stride_vn)[:, None] \
                + offs_d[None, :]
            k, v = _tile_pair(k_ptrs, v_ptrs, K_DESC, V_DESC, 0, 0, ok, True, False)
            m_i, l_i, acc = _decode_step(q, k, v, ok, m_i, l_i, acc, qk_scale, True, UPCAST, IEEE)
    else:
        # The range's whole tiles without masks (through TMA where TMA), then its last partial tile masked.
        full_hi = lo + tl.maximum(hi - lo, 0) // BLOCK_N * BLOCK_N
        row = b64 * KV_RB + hkv.to(tl.int64) * KV_RH  # token 0's row in the descriptors' [rows, D] view
        for start in range(lo, full_hi, BLOCK_N):
            tok = (start + offs_n).to(tl.int64)
            k, v = _tile_pair(k_head + tok[:, None] * stride_kn + offs_d[None, :],
                              v_head + tok[:, None] * stride_vn + offs_d[None, :], K_DESC, V_DESC,
                              (row + start).to(tl.int32), (row + start).to(tl.int32), offs_n < BLOCK_N, False, TMA)
            m_i, l_i, acc = _decode_step(q, k, v, offs_n < BLOCK_N, m_i, l_i, acc, qk_scale, False, UPCAST, IEEE)
        for start in range(full_hi, hi, BLOCK_N):
            tok = start + offs_n
            ok = tok < hi
            k, v = _tile_pair(k_head + tok.to(tl.int64)[:, None] * stride_kn + offs_d[None, :],
                              v_head + tok.to(tl.int64)[:, None] * stride_vn + offs_d[None, :], K_DESC, V_DESC,
                              0, 0, ok, True, False)
            m_i, l_i, acc = _decode_step(q, k, v, ok, m_i, l_i, acc, qk_scale, True, UPCAST, IEEE)

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    part = (b64 * HKV * GROUP + hq) * SLOTS + slot
    tl.store(O_PART + part[:, None] * HEAD_DIM + offs_d[None, :], acc / l_safe[:, None], mask=head_ok[:, None])
    tl.store(LSE_PART + part, m_i + tl.log2(l_safe), mask=head_ok)


@triton.jit
def _decode_split_kernel(
    Q, K, V, O_PART, LSE_PART,
    K_DESC, V_DESC,  # TMA: descriptors over k, v seen as one [rows, D] matrix (else k, v again)
    KV_RB, KV_RH,    # TMA: rows of that matrix per batch and per kv head (the same for k and v)
    SEQ_LENS,     # [B] int32 keys per sequence (HAS_LENS), else every sequence has N_CTX keys
    BLOCK_TABLE,  # [B, max_pages] int32 page ids (PAGED)
    qk_scale,     # softmax scale * log2(e)
    stride_qb, stride_qh,
    stride_kb, stride_kh, stride_kn,  # contiguous cache: batch, head, token. PAGED: page, head, token in page
    stride_vb, stride_vh, stride_vn,
    stride_bt,                        # elements between block-table rows
    N_CTX,                            # cache length (the largest seq_len when HAS_LENS)
    tokens_per_split,                 # a multiple of BLOCK_N (not BALANCED)
    HKV, SLOTS,                       # partial slots per (sequence, kv head): the splits, or BALANCED's most
    TILES_PER_SEQ, TILE_RANGE, TOTAL_TILES,  # BALANCED: ceil(N_CTX / BLOCK_N), tiles per program, B Hkv of those
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr,  # query heads per kv head, padded to a tl.dot tile (>= 16)
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr, PAGED: tl.constexpr, HAS_LENS: tl.constexpr, TMA: tl.constexpr, BALANCED: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr, RNE: tl.constexpr,
):
    """Splits: program (b Hkv + kv head, split) takes keys [split, split + 1) x tokens_per_split. BALANCED (every
    sequence N_CTX keys): the B Hkv sequences' tiles laid end to end, program p takes tiles [p, p + 1) x
    TILE_RANGE, one partial for each sequence its range touches (the slot: p less the first program touching
    that sequence), so every program streams the same bytes whatever B Hkv is against the SM count."""
    if BALANCED:
        p = tl.program_id(0)
        t = p * TILE_RANGE
        t_end = tl.minimum(TOTAL_TILES, t + TILE_RANGE)
        while t < t_end:
            bh = t // TILES_PER_SEQ
            seg_end = tl.minimum(t_end, (bh + 1) * TILES_PER_SEQ)
            first = bh * TILES_PER_SEQ
            _decode_part(Q, K, V, O_PART, LSE_PART, K_DESC, V_DESC, KV_RB, KV_RH, BLOCK_TABLE, qk_scale,
                         stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                         stride_bt, bh // HKV, bh % HKV, (t - first) * BLOCK_N,
                         tl.minimum(N_CTX, (seg_end - first) * BLOCK_N), p - first // TILE_RANGE, HKV, SLOTS,
                         GROUP, BLOCK_H, HEAD_DIM, BLOCK_N, PAGE, PAGED, TMA, UPCAST, IEEE)
            t = seg_end
    else:
        bh = tl.program_id(0)
        split = tl.program_id(1)
        b = bh // HKV
        if HAS_LENS:
            kv_len = tl.load(SEQ_LENS + b)
        else:
            kv_len = N_CTX + b * 0
        lo = split * tokens_per_split
        _decode_part(Q, K, V, O_PART, LSE_PART, K_DESC, V_DESC, KV_RB, KV_RH, BLOCK_TABLE, qk_scale,
                     stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                     stride_bt, b, bh % HKV, lo, tl.minimum(kv_len, lo + tokens_per_split), split, HKV, SLOTS,
                     GROUP, BLOCK_H, HEAD_DIM, BLOCK_N, PAGE, PAGED, TMA, UPCAST, IEEE)


@triton.jit
def _decode_combine_kernel(
    O_PART, LSE_PART, OUT,
    stride_ob, stride_oh,
    HQ, SLOTS,
    GROUP, TILES_PER_SEQ, TILE_RANGE,  # BALANCED: the split kernel's, to count each sequence's partials
    HEAD_DIM: tl.constexpr, SLOTS_POW2: tl.constexpr, BALANCED: tl.constexpr, RNE: tl.constexpr,
):
    """OUT[b, h] = sum_s 2^(lse_s - lse) o_s with lse = log2 sum_s 2^lse_s, partials added in order."""
    bh = tl.program_id(0).to(tl.int64)
    b = bh // HQ
    h = bh % HQ
    if BALANCED:  # the programs whose tile ranges touch this (sequence, kv head)
        kv = b * (HQ // GROUP) + h // GROUP
        count = ((kv + 1) * TILES_PER_SEQ - 1) // TILE_RANGE - kv * TILES_PER_SEQ // TILE_RANGE + 1
    else:
        count = SLOTS + b * 0
    s = tl.arange(0, SLOTS_POW2)
    s_ok = s < count
    offs_d = tl.arange(0, HEAD_DIM)
    lse_s = tl.load(LSE_PART + bh * SLOTS + s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse_s, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)  # no key at all (seq_len 0): every weight is 0 and o = 0
    w = tl.exp2(lse_s - m)
    o_s = tl.load(O_PART + (bh * SLOTS + s)[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None], other=0.0)
    total = tl.sum(w, axis=0)
    o = tl.sum(w[:, None] * o_s, axis=0) / tl.where(total > 0.0, total, 1.0)
    store_rounded(OUT + b * stride_ob + h * stride_oh + offs_d, o, offs_d < HEAD_DIM, RNE)


def decode_config(device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_N, warps, stages) of the split kernel: 64-token tiles, 4 warps, 2 stages on the GPU (the
    fastest with one split at the ANCHORS shape, dense and paged; 3 stages ran 10% slower there); 32 on the
    interpreter."""
    if device.type != "cuda":
        return 32, 4, 1
    return 64, 4, 2


def default_splits(batch: int, hkv: int, n_ctx: int, block_n: int, device: torch.device) -> int:
    """Splits so that batch x hkv x splits programs fill the GPU's SMs about once, each split at least 4 tiles long:
    at batch 64 and 8 kv heads one split (2, 4 and 8 splits were slower there, dense and paged; other
    batch sizes not measured)."""
    programs = max(1, batch * hkv)
    want = triton.cdiv(sm_count(device), programs)
    most = max(1, n_ctx // (4 * block_n))
    return max(1, min(want, most, 256))


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() not in (3, 4) or (q.dim() == 4 and q.shape[2] != 1):
        raise ValueError(f"decode_attention: q must be [B, Hq, D] or [B, Hq, 1, D], got {tuple(q.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"decode_attention: q, k, v must share one of fp16/bf16/fp32, got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}")
    d = q.shape[-1]
    if k.dim() != 4 or k.shape != v.shape or k.shape[-1] != d or d not in (16, 32, 64, 128, 256):
        raise ValueError(f"decode_attention: k and v must be 4-D of one shape with q's head dim (a power of two, "
                         f"16..256); got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")


def balanced_plan(seqs: int, n_ctx: int, block_n: int, programs: int) -> tuple[int, int, int, int]:
    """(programs, tiles per program, tiles per sequence, partial slots per sequence) of the balanced schedule:
    seqs x ceil(n_ctx / block_n) tiles laid end to end, cut into ranges of equal length, one a program."""
    per_seq = triton.cdiv(max(n_ctx, 1), block_n)
    total = seqs * per_seq
    tile_range = triton.cdiv(total, max(1, min(programs, total)))
    return triton.cdiv(total, tile_range), tile_range, per_seq, triton.cdiv(per_seq, tile_range) + 1


def _decode(q, k, v, kv_heads_dim, n_ctx, seq_lens, block_table, page, sm_scale, num_splits, config, tma=None,
            balanced=None):
    q3 = q.reshape(q.shape[0], q.shape[1], q.shape[-1]) if q.dim() == 4 else q
    q3 = q3 if q3.stride(-1) == 1 else q3.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    batch, hq, d = q3.shape
    hkv = k.shape[kv_heads_dim]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"decode_attention: query heads ({hq}) must be a multiple of kv heads ({hkv})")
    out = torch.empty((batch, hq, d), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out.view(q.shape)
    block_n, warps, stages = config or decode_config(q.device)
    # balanced: programs per SM of the balanced schedule, which needs every sequence at n_ctx keys (no seq_lens,
    # no pages); else the split grid.
    use_balanced = bool(balanced) and seq_lens is None and block_table is None
    if use_balanced:
        grid_n, tile_range, per_seq, slots = balanced_plan(batch * hkv, n_ctx, block_n,
                                                           balanced * sm_count(q.device))
        grid, per_split = (grid_n,), 0
    else:
        splits = num_splits or default_splits(batch, hkv, n_ctx, block_n, q.device)
        per_split = triton.cdiv(triton.cdiv(max(n_ctx, 1), splits), block_n) * block_n
        slots = max(1, triton.cdiv(max(n_ctx, 1), per_split))
        grid, tile_range, per_seq = (batch * hkv, slots), 1, 1
    o_part = torch.empty((batch, hq, slots, d), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((batch, hq, slots), dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    interp = q.device.type != "cuda"
    paged = block_table is not None
    if paged:  # [pages, PAGE, Hkv, D]: page, head, token-in-page strides
        ks, vs = (k.stride(0), k.stride(2), k.stride(1)), (v.stride(0), v.stride(2), v.stride(1))
    else:      # [B, Hkv, N, D]
        ks, vs = (k.stride(0), k.stride(1), k.stride(2)), (v.stride(0), v.stride(1), v.stride(2))
    # TMA (contiguous cache): a range's whole tiles through descriptors over k and v seen as one [rows, D] matrix
    # (the same view for both); whole tiles end at or before the sequence's length, so never reach another head's
    # rows, and the partial tail keeps masked pointer loads.
    views = (_row_view(k), _row_view(v)) if block_table is None and _want_tma(q, tma) else None
    use_tma = bool(views) and views[0] is not None and views[0] == views[1]
    descs, _, use_tma = _descs(((k, views[0]), (v, views[1])) if use_tma else ((k, None), (v, None)), block_n)
    rb, rh = views[0][:2] if use_tma else (0, 0)
    rne = interp and q.dtype == torch.bfloat16
    _decode_split_kernel[grid](
        q3, k, v, o_part, lse_part, *descs, rb, rh, seq_lens if seq_lens is not None else lse_part,
        block_table if paged else lse_part, scale * 1.4426950408889634,
        q3.stride(0), q3.stride(1), *ks, *vs, block_table.stride(0) if paged else 0, n_ctx, per_split, hkv, slots,
        per_seq, tile_range, batch * hkv * per_seq,
        GROUP=hq // hkv, BLOCK_H=max(16, triton.next_power_of_2(hq // hkv)), HEAD_DIM=d, BLOCK_N=block_n,
        PAGE=page, PAGED=paged, HAS_LENS=seq_lens is not None, TMA=use_tma, BALANCED=use_balanced, UPCAST=interp,
        IEEE=q.dtype == torch.float32, RNE=rne, num_warps=warps, num_stages=stages,
    )
    _decode_combine_kernel[(batch * hq,)](
        o_part, lse_part, out, out.stride(0), out.stride(1), hq, slots, hq // hkv, per_seq, tile_range,
        HEAD_DIM=d, SLOTS_POW2=triton.next_power_of_2(slots), BALANCED=use_balanced, RNE=rne, num_warps=4,
    )
    return out.view(q.shape)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
                     num_splits: int | None = None, config: tuple[int, int, int] | None = None,
                     seq_lens: torch.Tensor | None = None, tma: bool | None = None,
                     balanced: int | None = None) -> torch.Tensor:
    """One query per sequence against a contiguous cache k, v [B, Hkv, N, D] (optionally only the first
    seq_lens[b] keys of sequence b); returns q's shape. tma: K/V tiles through TMA descriptors (None: on sm_90+
    where the cache is one [rows, D] matrix). balanced: programs per SM of the balanced schedule (every
    program the same number of key tiles; without seq_lens), instead of num_splits' grid."""
    _check(q, k, v)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"decode_attention: batch sizes differ: q {q.shape[0]}, k {k.shape[0]}")
    if seq_lens is not None and (seq_lens.shape != (q.shape[0],) or seq_lens.dtype != torch.int32):
        raise ValueError("decode_attention: seq_lens must be an int32 tensor of shape [B]")
    return _decode(q, k, v, 1, k.shape[2], seq_lens, None, 1, sm_scale, num_splits, config, tma, balanced)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                           seq_lens: torch.Tensor, sm_scale: float | None = None, num_splits: int | None = None,
                           config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """One query per sequence against a paged cache k_cache, v_cache [num_pages, PAGE, Hkv, D]: token t of
    sequence b lives at page block_table[b, t // PAGE], row t % PAGE. Keys past seq_lens[b] are not read."""
    _check(q, k_cache, v_cache)
    b = q.shape[0]
    if block_table.dim() != 2 or block_table.shape[0] != b or block_table.dtype != torch.int32:
        raise ValueError(f"paged_decode_attention: block_table must be int32 [B, max_pages], got "
                         f"{tuple(block_table.shape)} {block_table.dtype}")
    if seq_lens.shape != (b,) or seq_lens.dtype != torch.int32:
        raise ValueError("paged_decode_attention: seq_lens must be an int32 tensor of shape [B]")
    page = k_cache.shape[1]
    if page & (page - 1):
        raise ValueError(f"paged_decode_attention: the page size must be a power of two, got {page}")
    n_ctx = block_table.shape[1] * page  # the most keys a sequence can hold: sizes the splits without a sync
    bt = block_table if block_table.stride(1) == 1 else block_table.contiguous()
    return _decode(q, k_cache, v_cache, 2, n_ctx, seq_lens, bt, page, sm_scale, num_splits, config)


class ModelNew(nn.Module):
    """tasks/decode_attention.py: SDPA(q, k, v, enable_gqa=True) for one query token per sequence."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return decode_attention(q, k, v)
