"""The Mixtral-style MoE block, forward and backward in one call (tasks/moe_block_fwd_bwd.py): x [T, H] bf16, router
logits [T, E], the experts' w1, w3 [E, F, H] and w2 [E, H, F], an upstream gradient dy [T, H] -> y, dx, dlogits,
dw1, dw3, dw2. Every step runs on the device from device-side counts: no host sync, no per-expert Python loop.

Forward (p: a sorted position of the aligned layout of seeds/moe.py, id = t K + k its (token, slot) pair, e its
expert; every product a grouped GEMM of seeds/moe.py):
    w, ids = top-k of softmax(logits), renormalised (fp32)               seeds/moe_layer.route
    layout = the pairs sorted by expert, padded to BLOCK_M per expert    seeds/moe.align_block_size
    xs[p] = x[id // K]                                                   seeds/moe_layer.gather_rows
    g[p] = xs[p] @ w1[e]^T,  u[p] = xs[p] @ w3[e]^T   the pre-activations, kept for the backward
    h[p] = silu(g) * u                                                   _swiglu_fwd_kernel
    yk[id] = h[p] @ w2[e]^T   back in (token, slot) order
    y[t] = sum_k w[t, k] yk[t K + k]   (fp32)                            seeds/moe_layer.combine
Backward (the operands of the expert GEMMs stay in sorted order, so each expert's rows are one run):
    dw[t, k] = <dy[t], yk[t K + k]> (fp32),  dyk[p] = w[t, k] dy[t]     _combine_bwd_kernel
    dW2[e] = dyk_e^T h_e,  dh[p] = dyk[p] @ w2[e]
    dg = dh u silu'(g),  du = dh silu(g),  silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)   _swiglu_bwd_kernel
    dW1[e] = dg_e^T xs_e,  dW3[e] = du_e^T xs_e
    dx[t] = sum_k (dg[p] @ w1[e] + du[p] @ w3[e])                        two grouped GEMMs, two combines
    router, with S = sum_k p_k over the chosen experts and w_k = p_k / S:
        dp_j = (dw_j - sum_k dw_k w_k) / S for a chosen j, 0 for the others
        dlogits = p * (dp - sum_j p_j dp_j)                              _router_bwd_kernel
Outputs are rounded where the bf16 reference rounds (silu(g) before its product with u; dh u before its product
with silu'(g); each of the two products of dx before their sum): its errors then track PyTorch's own elementwise,
which the harness needs on inputs such as constant rows, where one rounding of the fp32 sums misses its tolerance.
grouped_dw names a row by its id; the backward's operands are in sorted order, so it reads them through the layout's
positional view (seeds/moe.by_position), where expert e owns positions start[e] .. start[e] + count[e].
Padding rows (the sentinel id, at the end of each expert's run) of xs, g, u, h, dyk, dh, dg and du are never
written: the grouped GEMMs load them as zeros (pointer kernel) or compute their rows and never store them (TMA
kernel: a row's product depends on that row alone), grouped_dw stops at each expert's count, the elementwise
kernels skip them.
FLOPs 18 T K H F (6 forward, 12 backward): 34.6 TFLOP at the task's shape. On its own not yet timed on the GPU;
accepted by the harness at Mixtral small's shape on the H200, where the patched model trains 1.88x faster than
eager (docs/model.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from seeds.cross_entropy import needs_rne, store_rounded
from seeds.moe import (Aligned, _round_to, align_block_size, by_position, default_config, grouped_dw,
                       grouped_gemm)
from seeds.moe_layer import combine, gather_rows, route
from seeds.swiglu import _act_and_grad

CRUCIBLE_SEED = {
    "name": "moe_block",
    "tasks": ["moe_block_fwd_bwd.py"],
    "ops": ["MoE block fwd+bwd: route, grouped GEMMs keeping the pre-activations, SwiGLU, combine, and their "
            "gradients through the router's renormalised top-k softmax"],
}


@triton.jit
def _row_ids(SORTED_IDS, NUM_PADDED, n_valid, BLOCK_R: tl.constexpr):
    """This program's sorted positions, their ids, and which of them hold a routed pair (not padding)."""
    pos = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ids = tl.load(SORTED_IDS + pos, mask=pos < tl.load(NUM_PADDED), other=n_valid)
    return pos.to(tl.int64), ids.to(tl.int64), ids < n_valid


@triton.jit
def _gate_up_tile(G, U, SORTED_IDS, NUM_PADDED, n_valid, F, stride, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    """This program's tile of g and u (fp32) over routed rows: (offsets, mask, g, u)."""
    pos, _, ok = _row_ids(SORTED_IDS, NUM_PADDED, n_valid, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = ok[:, None] & (cols < F)[None, :]
    offs = pos[:, None] * stride + cols[None, :]
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=mask, other=0.0).to(tl.float32)
    return offs, mask, g, u


@triton.jit
def _swiglu_fwd_kernel(
    G, U, H_OUT,              # [P, F] each, in sorted order, one row stride
    SORTED_IDS, NUM_PADDED, n_valid, F, stride,
    RNE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr,
):
    offs, mask, g, u = _gate_up_tile(G, U, SORTED_IDS, NUM_PADDED, n_valid, F, stride, BLOCK_R, BLOCK_F)
    act, _ = _act_and_grad(g, 0, False)
    store_rounded(H_OUT + offs, _round_to(act, H_OUT.dtype.element_ty, RNE) * u, mask, RNE)


@triton.jit
def _swiglu_bwd_kernel(
    G, U, DH, DG, DU,         # [P, F] each, in sorted order, one row stride
    SORTED_IDS, NUM_PADDED, n_valid, F, stride,
    RNE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr,
):
    # h = silu(g) u  =>  dg = (dh u) silu'(g),  du = dh silu(g)
    offs, mask, g, u = _gate_up_tile(G, U, SORTED_IDS, NUM_PADDED, n_valid, F, stride, BLOCK_R, BLOCK_F)
    dh = tl.load(DH + offs, mask=mask, other=0.0).to(tl.float32)
    act, grad = _act_and_grad(g, 0, True)
    store_rounded(DG + offs, _round_to(dh * u, DG.dtype.element_ty, RNE) * grad, mask, RNE)
    store_rounded(DU + offs, dh * _round_to(act, DU.dtype.element_ty, RNE), mask, RNE)


@triton.jit
def _combine_bwd_kernel(
    DY, YK, WEIGHTS,          # DY [T, H]; YK [T*K, H] in (token, slot) order; WEIGHTS [T, K] fp32
    SORTED_IDS, NUM_PADDED,
    DYK, DWEIGHTS,            # out DYK [P, H] in sorted order, DWEIGHTS [T, K] fp32
    n_valid, H, stride_dy, stride_yk, stride_dyk,
    TOP_K: tl.constexpr, RNE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
):
    # y[t] = sum_k w[t, k] yk[t K + k]  =>  dw[t, k] = <dy[t], yk[t K + k]>,  dyk[t K + k] = w[t, k] dy[t]
    pos, ids, ok = _row_ids(SORTED_IDS, NUM_PADDED, n_valid, BLOCK_R)
    tok = ids // TOP_K
    w = tl.load(WEIGHTS + ids, mask=ok, other=0.0)
    dot = tl.zeros([BLOCK_R], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        mask = ok[:, None] & (cols < H)[None, :]
        dy = tl.load(DY + tok[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        yk = tl.load(YK + ids[:, None] * stride_yk + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dot += tl.sum(dy * yk, axis=1)
        store_rounded(DYK + pos[:, None] * stride_dyk + cols[None, :], w[:, None] * dy, mask, RNE)
    tl.store(DWEIGHTS + ids, dot, mask=ok)


@triton.jit
def _router_bwd_kernel(
    LOGITS, IDS, DWEIGHTS, DLOGITS,  # LOGITS [T, E]; IDS [T, K] int32; DWEIGHTS [T, K] fp32; out DLOGITS [T, E]
    T, E, stride_l, stride_dl,
    TOP_K: tl.constexpr, RNE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    row_ok = rows < T
    mask = row_ok[:, None] & (cols[None, :] < E)
    rows64 = rows.to(tl.int64)
    logits = tl.load(LOGITS + rows64[:, None] * stride_l + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    logits = tl.where(cols[None, :] < E, logits, -float("inf"))
    shifted = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    p = shifted / tl.sum(shifted, axis=1)[:, None]  # as seeds/moe_layer.route computes it
    total = tl.zeros([BLOCK_T], dtype=tl.float32)     # S
    weighted = tl.zeros([BLOCK_T], dtype=tl.float32)  # sum_k dw_k p_k
    for k in tl.static_range(TOP_K):
        chosen = cols[None, :] == tl.load(IDS + rows64 * TOP_K + k, mask=row_ok, other=0)[:, None]
        p_k = tl.sum(tl.where(chosen, p, 0.0), axis=1)
        total += p_k
        weighted += tl.load(DWEIGHTS + rows64 * TOP_K + k, mask=row_ok, other=0.0) * p_k
    mean = weighted / total  # sum_k dw_k w_k
    dp = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        chosen = cols[None, :] == tl.load(IDS + rows64 * TOP_K + k, mask=row_ok, other=0)[:, None]
        dw_k = tl.load(DWEIGHTS + rows64 * TOP_K + k, mask=row_ok, other=0.0)
        dp = tl.where(chosen, ((dw_k - mean) / total)[:, None], dp)
    dlogits = p * (dp - tl.sum(p * dp, axis=1)[:, None])
    store_rounded(DLOGITS + rows64[:, None] * stride_dl + cols[None, :], dlogits, mask, RNE)


@dataclass(frozen=True)
class BlockSaved:
    """What the forward leaves for the backward: its inputs, the routing, and the intermediates in sorted order."""

    x: torch.Tensor          # [T, H]
    logits: torch.Tensor     # [T, E]
    w1: torch.Tensor         # [E, F, H]
    w3: torch.Tensor         # [E, F, H]
    w2: torch.Tensor         # [E, H, F]
    top_k: int
    weights: torch.Tensor    # [T, K] fp32, renormalised
    ids: torch.Tensor        # [T, K] int32
    layout: Aligned
    xs: torch.Tensor         # [P, H]  x's rows in sorted order
    g: torch.Tensor          # [P, F]  gate pre-activations
    u: torch.Tensor          # [P, F]  up pre-activations
    h: torch.Tensor          # [P, F]  silu(g) * u
    yk: torch.Tensor         # [T*K, H] each expert's output, in (token, slot) order
    config: tuple            # the grouped GEMMs' tiles
    variant: dict            # the grouped GEMMs' impl / warp_specialize / flatten


def _row_blocks(device: torch.device, n: int) -> tuple[int, int]:
    """(rows, columns) per program of the row kernels: few wide programs on the interpreter (it pays per program),
    about 4K elements each on a GPU."""
    if device.type != "cuda":
        return 16, min(256, max(16, triton.next_power_of_2(n)))
    return 4, min(1024, max(16, triton.next_power_of_2(n)))


def _swiglu_rows(g: torch.Tensor, u: torch.Tensor, layout: Aligned,
                 dh: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """(h,) from g and u, or with dh, (dg, du): [P, F] each, routed rows only."""
    rows, ffn = g.shape
    block_r, block_f = _row_blocks(g.device, ffn)
    grid = (triton.cdiv(rows, block_r), triton.cdiv(ffn, block_f))
    outs = tuple(torch.empty_like(g) for _ in range(1 if dh is None else 2))
    flags = dict(RNE=needs_rne(outs[0]), BLOCK_R=block_r, BLOCK_F=block_f, num_warps=4)
    layout_args = (layout.sorted_ids, layout.num_padded, layout.n_valid, ffn, g.stride(0))
    if dh is None:
        _swiglu_fwd_kernel[grid](g, u, *outs, *layout_args, **flags)
    else:
        _swiglu_bwd_kernel[grid](g, u, dh, *outs, *layout_args, **flags)
    return outs


def _check(x: torch.Tensor, logits: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor,
           top_k: int) -> None:
    if x.dim() != 2 or w1.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"moe_block: expected x [T, H], w1 and w3 [E, F, H], w2 [E, H, F], got {tuple(x.shape)}, "
                         f"{tuple(w1.shape)}, {tuple(w2.shape)}")
    t, hidden = x.shape
    experts, ffn, _ = w1.shape
    if w1.shape != (experts, ffn, hidden) or w3.shape != w1.shape or w2.shape != (experts, hidden, ffn):
        raise ValueError(f"moe_block: w1 {tuple(w1.shape)}, w3 {tuple(w3.shape)} and w2 {tuple(w2.shape)} do not "
                         f"fit x {tuple(x.shape)}")
    if logits.shape != (t, experts):
        raise ValueError(f"moe_block: expected router logits [{t}, {experts}], got {tuple(logits.shape)}")
    if not 1 <= top_k <= experts:
        raise ValueError(f"moe_block: top_k must be in [1, {experts}], got {top_k}")


def moe_block_forward(x: torch.Tensor, logits: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor,
                      top_k: int, config=None, **variant) -> tuple[torch.Tensor, BlockSaved]:
    """(y [T, H], what the backward needs) for the block (module docstring). config: the grouped GEMMs' tiles
    (seeds.moe.default_config); variant: their impl / warp_specialize / flatten (on a GPU through TMA,
    warp-specialised by default, as seeds/moe_layer.py's forward)."""
    _check(x, logits, w1, w3, w2, top_k)
    x, logits = x.contiguous(), logits.contiguous()
    w1, w3, w2 = w1.contiguous(), w3.contiguous(), w2.contiguous()
    config = config or default_config(x.device)
    if x.device.type == "cuda" and variant.get("impl", "auto") != "ptr":
        variant.setdefault("warp_specialize", True)
    weights, ids = route(logits, top_k)
    layout = align_block_size(ids, w1.shape[0], config[0])
    xs = gather_rows(x, layout, top_k)
    g, u = (grouped_gemm(xs, w, layout, xs.new_empty((xs.shape[0], w1.shape[1])), gather_a=False,
                         scatter_c=False, config=config, **variant) for w in (w1, w3))
    (h,) = _swiglu_rows(g, u, layout)
    yk = grouped_gemm(h, w2, layout, x.new_empty((x.shape[0] * top_k, x.shape[1])), gather_a=False, scatter_c=True,
                      config=config, **variant)
    y = combine(yk, weights, torch.empty_like(x))
    return y, BlockSaved(x, logits, w1, w3, w2, top_k, weights, ids, layout, xs, g, u, h, yk, config, variant)


def _combine_bwd(s: BlockSaved, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dyk [P, H] in sorted order, dweights [T, K] fp32)."""
    hidden = dy.shape[1]
    dyk = dy.new_empty((s.xs.shape[0], hidden))
    dweights = torch.empty_like(s.weights)
    block_r, block_h = _row_blocks(dy.device, hidden)
    _combine_bwd_kernel[(triton.cdiv(dyk.shape[0], block_r),)](
        dy, s.yk, s.weights, s.layout.sorted_ids, s.layout.num_padded, dyk, dweights, s.layout.n_valid, hidden,
        dy.stride(0), s.yk.stride(0), dyk.stride(0), TOP_K=s.top_k, RNE=needs_rne(dyk), BLOCK_R=block_r,
        BLOCK_H=block_h, num_warps=4)
    return dyk, dweights


def _router_bwd(s: BlockSaved, dweights: torch.Tensor) -> torch.Tensor:
    t, experts = s.logits.shape
    dlogits = torch.empty_like(s.logits)
    block_e = max(16, triton.next_power_of_2(experts))
    block_t = max(1, min(64, 4096 // block_e))
    if t:
        _router_bwd_kernel[(triton.cdiv(t, block_t),)](
            s.logits, s.ids, dweights, dlogits, t, experts, s.logits.stride(0), dlogits.stride(0), TOP_K=s.top_k,
            RNE=needs_rne(dlogits), BLOCK_T=block_t, BLOCK_E=block_e, num_warps=4)
    return dlogits


def _dx(s: BlockSaved, dg: torch.Tensor, du: torch.Tensor) -> torch.Tensor:
    """dx[t] = sum_k (dg[p] @ w1[e] + du[p] @ w3[e]) with p the position of (t, k): each product rounded, their sum
    rounded, then the sum over k rounded once (fp32), as the reference's autograd accumulates them for top-2."""
    t, hidden = s.x.shape
    pairs = s.x.new_empty((t * s.top_k, 2, hidden))  # row (t K + k) holds dg @ w1 then du @ w3
    for j, (grad, w) in enumerate(((dg, s.w1), (du, s.w3))):
        grouped_gemm(grad, w, s.layout, pairs[:, j], transpose_b=True, gather_a=False, scatter_c=True,
                     config=s.config, **s.variant)
    ones = torch.ones((t * s.top_k, 2), dtype=torch.float32, device=s.x.device)
    per_slot = combine(pairs.view(-1, hidden), ones, s.x.new_empty((t * s.top_k, hidden)))
    ones = torch.ones((t, s.top_k), dtype=torch.float32, device=s.x.device)
    return combine(per_slot, ones, torch.empty_like(s.x))


def moe_block_backward(s: BlockSaved, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(dx, dlogits, dw1, dw3, dw2) for the upstream gradient dy [T, H] (module docstring)."""
    if dy.shape != s.x.shape or dy.dtype != s.x.dtype:
        raise ValueError(f"moe_block: expected dy {tuple(s.x.shape)} {s.x.dtype}, got {tuple(dy.shape)} {dy.dtype}")
    dy = dy.contiguous()
    dyk, dweights = _combine_bwd(s, dy)
    by_pos, impl = by_position(s.layout), s.variant.get("impl", "auto")
    dw2 = grouped_dw(dyk, s.h, by_pos, torch.empty_like(s.w2), impl=impl)
    dh = grouped_gemm(dyk, s.w2, s.layout, torch.empty_like(s.h), transpose_b=True, gather_a=False,
                      scatter_c=False, config=s.config, **s.variant)
    dg, du = _swiglu_rows(s.g, s.u, s.layout, dh)
    dw1 = grouped_dw(dg, s.xs, by_pos, torch.empty_like(s.w1), impl=impl)
    dw3 = grouped_dw(du, s.xs, by_pos, torch.empty_like(s.w3), impl=impl)
    return _dx(s, dg, du), _router_bwd(s, dweights), dw1, dw3, dw2


class ModelNew(torch.nn.Module):
    """tasks/moe_block_fwd_bwd.py: (y, dx, dlogits, dw1, dw3, dw2) of the MoE block for router logits and dy."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.empty(experts, ffn, hidden, dtype=torch.bfloat16))
        self.w3 = torch.nn.Parameter(torch.empty(experts, ffn, hidden, dtype=torch.bfloat16))
        self.w2 = torch.nn.Parameter(torch.empty(experts, hidden, ffn, dtype=torch.bfloat16))
        self.top_k = top_k

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor, dy: torch.Tensor):
        y, saved = moe_block_forward(x, router_logits, self.w1.detach(), self.w3.detach(), self.w2.detach(),
                                     self.top_k)
        return (y, *moe_block_backward(saved, dy))
