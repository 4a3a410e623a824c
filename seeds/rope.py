"""Rotary position embedding (RoPE), Llama layout, forward and backward, q and k rotated in one launch.

q: [B, T, Hq, D], k: [B, T, Hk, D] (Hq and Hk may differ: grouped-query attention), cos and sin: [T, D] as Hugging
Face builds them (the two halves of each row hold the same frequencies, but the kernel does not assume so), any float
dtype, fp32 maths. With x = (x1, x2) split at D/2 and likewise c = (c1, c2), s = (s1, s2):
    forward   y1 = x1 c1 - x2 s1,      y2 = x2 c2 + x1 s2          (y = x cos + rotate_half(x) sin)
    backward  dx1 = dy1 c1 + dy2 s2,   dx2 = dy2 c2 - dy1 s1      (the transpose of that rotation)
One program per token (b, t) rotates all Hq + Hk heads of that token, so cos[t] and sin[t] are read once per token.
Bytes (bf16, B4 T4096 Hq32 Hk8 D128): read q, k and write them rotated, 2 x 2 x 4 x 4096 x 40 x 128 B = 335.5 MB, plus
cos/sin 2 MB: 80 us at the H200's copy bandwidth of 4,244 GB/s.

Measured on the H200 (docs/bench-mix.md): forward 0.088 ms = 3,842 GB/s (90.5% of the measured copy; Liger in place
0.095, torch.compile 0.149, eager 1.08), backward 0.089 ms = 3,800 GB/s (8.2x the best baseline, which recomputes
the forward through autograd). Short of the 3,900 GB/s target by 1.5%.

Variants (`rope(..., tokens=, store_cache=, programs=, stages=)`; benchmarks/sweep_fwd_rows.py: none
faster than the default's 3,820 GB/s, which ties torch.compile at 96.7% of a copy of the same bytes; 2 tokens a
program 3,823, persistent with stages 3,375-3,467): a kernel rotating blocks of TOKENS consecutive tokens as one [TOKENS, H, D/2] tile per half, unmasked
when the head counts and D/2 are powers of two and TOKENS divides B*T, with 32-bit offsets when q and k fit; one
block per program, or a persistent grid whose loop Triton's pipeliner can run `stages` - 1 blocks ahead through
shared memory (cp.async in the sm_90 PTX of triton 3.9). The default stays the one-token kernel.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CRUCIBLE_SEED = {"name": "rope", "tasks": ["rope_fwd.py"], "ops": ["RoPE fwd (Llama layout, GQA)"]}


@triton.jit
def _rotate(x1, x2, c1, c2, s1, s2, BWD: tl.constexpr):
    """(y1, y2) of the halves (x1, x2): the rotation, or with BWD its transpose."""
    if BWD:
        y1 = x1 * c1 + x2 * s2
        y2 = x2 * c2 - x1 * s1
    else:
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
    return y1, y2


@triton.jit
def _rotate_heads(X, Y, row, n_heads, c1, c2, s1, s2, HALF, BWD: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_HALF: tl.constexpr):
    """Rotate the n_heads x D block of token `row` (contiguous, n_heads * D elements) from X into Y."""
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < n_heads) & (cols < HALF)
    offs = row.to(tl.int64) * n_heads * 2 * HALF + heads * 2 * HALF + cols
    x1 = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(X + offs + HALF, mask=mask, other=0.0).to(tl.float32)
    y1, y2 = _rotate(x1, x2, c1, c2, s1, s2, BWD)
    tl.store(Y + offs, y1.to(Y.dtype.element_ty), mask=mask)
    tl.store(Y + offs + HALF, y2.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, COS, SIN,
    T, n_q_heads, n_k_heads, HALF,  # HALF = D / 2
    BWD: tl.constexpr,  # apply the transposed rotation (backward)
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    row = tl.program_id(0)  # token index in [0, B * T)
    t = row % T
    cols = tl.arange(0, BLOCK_HALF)[None, :]
    cmask = cols < HALF
    base = t.to(tl.int64) * 2 * HALF
    c1 = tl.load(COS + base + cols, mask=cmask, other=0.0).to(tl.float32)
    c2 = tl.load(COS + base + HALF + cols, mask=cmask, other=0.0).to(tl.float32)
    s1 = tl.load(SIN + base + cols, mask=cmask, other=0.0).to(tl.float32)
    s2 = tl.load(SIN + base + HALF + cols, mask=cmask, other=0.0).to(tl.float32)
    _rotate_heads(Q, QO, row, n_q_heads, c1, c2, s1, s2, HALF, BWD, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(K, KO, row, n_k_heads, c1, c2, s1, s2, HALF, BWD, BLOCK_HK, BLOCK_HALF)


@triton.jit
def _rotate_token_block(X, Y, tok0, n_tokens, n_heads, c1, c2, s1, s2, HALF, BWD: tl.constexpr,
                        TOKENS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
                        EVEN: tl.constexpr, WIDE: tl.constexpr, STORE_CACHE: tl.constexpr):
    """Rotate tokens [tok0, tok0 + TOKENS) of X (each n_heads x D, contiguous) into Y as one [TOKENS, H, HALF]
    tile per half: every load of the block is issued before the first store. c*, s*: [TOKENS, 1, BLOCK_HALF]."""
    toks = tl.arange(0, TOKENS)[:, None, None]
    heads = tl.arange(0, BLOCK_H)[None, :, None]
    cols = tl.arange(0, BLOCK_HALF)[None, None, :]
    tok = tok0 + toks
    if WIDE:  # 64-bit offsets only for a q or k past 2^31 elements
        tok = tok.to(tl.int64)
    offs = tok * n_heads * 2 * HALF + heads * 2 * HALF + cols
    if EVEN:
        x1 = tl.load(X + offs).to(tl.float32)
        x2 = tl.load(X + offs + HALF).to(tl.float32)
    else:
        mask = (tok0 + toks < n_tokens) & (heads < n_heads) & (cols < HALF)
        x1 = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(X + offs + HALF, mask=mask, other=0.0).to(tl.float32)
    y1, y2 = _rotate(x1, x2, c1, c2, s1, s2, BWD)
    if EVEN:
        tl.store(Y + offs, y1.to(Y.dtype.element_ty), cache_modifier=STORE_CACHE)
        tl.store(Y + offs + HALF, y2.to(Y.dtype.element_ty), cache_modifier=STORE_CACHE)
    else:
        tl.store(Y + offs, y1.to(Y.dtype.element_ty), mask=mask, cache_modifier=STORE_CACHE)
        tl.store(Y + offs + HALF, y2.to(Y.dtype.element_ty), mask=mask, cache_modifier=STORE_CACHE)


@triton.jit
def _rope_token_block(Q, K, QO, KO, COS, SIN, blk, n_tokens, T, n_q_heads, n_k_heads, HALF, BWD: tl.constexpr,
                      TOKENS: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
                      EVEN: tl.constexpr, WIDE: tl.constexpr, STORE_CACHE: tl.constexpr):
    # Tokens [blk * TOKENS, blk * TOKENS + TOKENS): cos and sin of their positions, then q's and k's heads.
    tok0 = blk * TOKENS
    toks = tok0 + tl.arange(0, TOKENS)[:, None, None]
    cols = tl.arange(0, BLOCK_HALF)[None, None, :]
    base = (toks % T) * 2 * HALF + cols
    if EVEN:
        c1 = tl.load(COS + base).to(tl.float32)
        c2 = tl.load(COS + base + HALF).to(tl.float32)
        s1 = tl.load(SIN + base).to(tl.float32)
        s2 = tl.load(SIN + base + HALF).to(tl.float32)
    else:
        cmask = (toks < n_tokens) & (cols < HALF)
        c1 = tl.load(COS + base, mask=cmask, other=0.0).to(tl.float32)
        c2 = tl.load(COS + base + HALF, mask=cmask, other=0.0).to(tl.float32)
        s1 = tl.load(SIN + base, mask=cmask, other=0.0).to(tl.float32)
        s2 = tl.load(SIN + base + HALF, mask=cmask, other=0.0).to(tl.float32)
    _rotate_token_block(Q, QO, tok0, n_tokens, n_q_heads, c1, c2, s1, s2, HALF, BWD, TOKENS, BLOCK_HQ, BLOCK_HALF,
                        EVEN, WIDE, STORE_CACHE)
    _rotate_token_block(K, KO, tok0, n_tokens, n_k_heads, c1, c2, s1, s2, HALF, BWD, TOKENS, BLOCK_HK, BLOCK_HALF,
                        EVEN, WIDE, STORE_CACHE)


@triton.jit
def _rope_tokens_kernel(
    Q, K, QO, KO, COS, SIN,
    n_tokens, T, n_q_heads, n_k_heads, HALF,  # n_tokens = B * T; HALF = D / 2
    BWD: tl.constexpr,  # apply the transposed rotation (backward)
    TOKENS: tl.constexpr,  # tokens per block
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
    EVEN: tl.constexpr,  # head counts and D / 2 are the blocks and TOKENS divides B * T: no masks
    WIDE: tl.constexpr,  # 64-bit offsets (q or k past 2^31 elements)
    STORE_CACHE: tl.constexpr,  # cache modifier of the rotated stores ("" or ".cs", streaming)
    PERSISTENT: tl.constexpr,  # programs walk blocks pid, pid + programs, ...; else one block per program
    STAGES: tl.constexpr,  # persistent: > 1 lets Triton's pipeliner load STAGES - 1 blocks ahead (shared memory)
):
    # _rope_kernel's maths for blocks of TOKENS consecutive tokens: fewer, larger programs with
    # TOKENS x (Hq + Hk) x D elements of loads in flight each, or a persistent grid that loads ahead.
    pid = tl.program_id(0)
    if not PERSISTENT:
        _rope_token_block(Q, K, QO, KO, COS, SIN, pid, n_tokens, T, n_q_heads, n_k_heads, HALF, BWD, TOKENS,
                          BLOCK_HQ, BLOCK_HK, BLOCK_HALF, EVEN, WIDE, STORE_CACHE)
    else:
        for blk in tl.range(pid, tl.cdiv(n_tokens, TOKENS), tl.num_programs(0), num_stages=STAGES):
            _rope_token_block(Q, K, QO, KO, COS, SIN, blk, n_tokens, T, n_q_heads, n_k_heads, HALF, BWD, TOKENS,
                              BLOCK_HQ, BLOCK_HK, BLOCK_HALF, EVEN, WIDE, STORE_CACHE)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool = False,
         num_warps: int | None = None, *, tokens: int = 0, store_cache: str = "", programs: int | None = None,
         stages: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated (q, k); with backward=True, the gradients of q and k for upstream gradients passed as q and k.
    `tokens` = 0 (the default) launches one program per token (_rope_kernel); a power of two launches
    _rope_tokens_kernel on blocks of that many tokens, unmasked where the shapes allow, its stores with
    `store_cache` ("" or ".cs"); `programs`: a persistent grid of that many programs walking the blocks, whose
    loop `stages` > 1 pipelines through shared memory. Options for the GPU sweep (benchmarks/sweep_fwd_rows.py)."""
    if tokens < 0 or tokens & (tokens - 1):
        raise ValueError(f"rope: tokens per program must be 0 (one-token kernel) or a power of two, got {tokens}")
    if store_cache not in ("", ".cs"):
        raise ValueError(f"rope: store_cache must be '' or '.cs', got {store_cache!r}")
    if (store_cache or programs is not None) and not tokens:
        raise ValueError("rope: store_cache and programs are options of the token-block kernel (tokens > 0)")
    if programs is not None and programs < 1:
        raise ValueError(f"rope: programs must be a positive grid size, got {programs}")
    if stages < 1 or (stages > 1 and programs is None):
        raise ValueError(f"rope: stages must be 1, or more with a persistent grid (programs), got {stages}")
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"rope: q and k must be [B, T, H, D], got {tuple(q.shape)} and {tuple(k.shape)}")
    B, T, n_q, D = q.shape
    if k.shape[0] != B or k.shape[1] != T or k.shape[3] != D:
        raise ValueError(f"rope: k {tuple(k.shape)} must match q {tuple(q.shape)} in B, T and D")
    if D % 2:
        raise ValueError(f"rope: the head dimension must be even, got {D}")
    if cos.shape != (T, D) or sin.shape != (T, D):
        raise ValueError(f"rope: cos and sin must be [T, D] = [{T}, {D}], got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if q.dtype != k.dtype or not q.is_floating_point():
        raise ValueError(f"rope: q and k must share one floating dtype, got {q.dtype} and {k.dtype}")
    q, k, cos, sin = q.contiguous(), k.contiguous(), cos.contiguous(), sin.contiguous()
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    if q.numel() == 0 and k.numel() == 0:
        return qo, ko
    n_k = k.shape[2]
    half = D // 2
    block_hq, block_hk = triton.next_power_of_2(max(n_q, 1)), triton.next_power_of_2(max(n_k, 1))
    block_half = triton.next_power_of_2(half)
    if num_warps is None:  # about 32 fp32 values of the larger tile per thread and half: 2 warps at Hq 32, D 128
        # (H200, one token per program: w=2 0.088 ms, w=4 0.090, w=8 0.096); scaled by the tokens per program
        num_warps = max(1, min(8, max(tokens, 1) * block_hq * block_half // 1024))
    if tokens:
        n_tokens = B * T
        even = n_q == block_hq and n_k == block_hk and half == block_half and n_tokens % tokens == 0
        wide = max(q.numel(), k.numel()) >= 2 ** 31
        blocks = triton.cdiv(n_tokens, tokens)
        _rope_tokens_kernel[(min(programs, blocks) if programs else blocks,)](
            q, k, qo, ko, cos, sin, n_tokens, T, n_q, n_k, half, BWD=backward, TOKENS=tokens, BLOCK_HQ=block_hq,
            BLOCK_HK=block_hk, BLOCK_HALF=block_half, EVEN=even, WIDE=wide, STORE_CACHE=store_cache,
            PERSISTENT=programs is not None, STAGES=stages, num_warps=num_warps)
        return qo, ko
    _rope_kernel[(B * T,)](q, k, qo, ko, cos, sin, T, n_q, n_k, half, BWD=backward, BLOCK_HQ=block_hq,
                           BLOCK_HK=block_hk, BLOCK_HALF=block_half, num_warps=num_warps)
    return qo, ko


class RoPEFunction(torch.autograd.Function):
    """Rotates q and k; the backward is the transposed rotation of the incoming gradients (cos and sin get none)."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        return rope(q, k, cos, sin)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        dq, dk = rope(dq, dk, cos, sin, backward=True)
        return dq, dk, None, None


class ModelNew(torch.nn.Module):
    """tasks/rope_fwd.py: (q cos + rotate_half(q) sin, k cos + rotate_half(k) sin)."""

    def forward(self, q, k, cos, sin):
        return rope(q, k, cos, sin)
