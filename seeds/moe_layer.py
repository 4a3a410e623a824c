"""A fused MoE layer forward: route -> align -> gate/up grouped GEMM with SwiGLU in its epilogue -> down grouped
GEMM -> weighted combine. x [T, H] bf16, router logits [T, E], w_gate_up [E, 2F, H] ([gate; up] rows), w_down
[E, H, F]; returns [T, H] in x's dtype. Five kinds of launch (seeds/moe.py has the layout and the GEMMs):
    1. router: per block of tokens, the scores, the top-k experts and their renormalised weights (one kernel)
         softmax (Mixtral):      p = softmax(l); ids = top-k(p); w = p[ids] / sum p[ids]
         sigmoid (DeepSeek-V3):  s = sigmoid(l); ids = top-k(s + bias); w = s[ids] / sum s[ids]
       times routed_scale. Ties go to the lower expert index (the tasks draw tie-free logits).
    2. align (three small kernels): the (token, slot) pairs sorted by expert, padded to BLOCK_M per expert
    3. h[sorted row] = silu(x[t] @ Wg_e^T) * (x[t] @ Wu_e^T): the gate and up products of a tile share the x tile,
       so the [T*K, 2F] pre-activation is never written; h [T*K + padding, F] in x's dtype. TMA variant: the
       gate/up tiles by TMA from w_gate_up viewed [E*2F, H]; x's rows are gathered (token = id // K), so they stay
       pointer loads (Hopper's TMA has no row gather)
    4. y[t*K + k] = h[sorted row] @ Wd_e^T, written back in (token, slot) order. TMA variant: h's blocks (one run
       of sorted rows each) and w_down viewed [E*H, F] both by TMA
    5. out[t] = sum_k w[t, k] * y[t*K + k], in fp32, in slot order (deterministic, no atomics)
FLOPs 6 T K H F: 11.5 TFLOP at the Mixtral shape (16k tokens), 2.27 TFLOP at the DeepSeek/Qwen shape.
Bytes beyond the weights: h and y (T K (F + H) x 2 B) written and read once each.

Measured on the H200 (benchmarks/bench_moe.py, do_bench), 16k tokens, the default
tiles (TMA, up 128x128 with SwiGLU, down 128x256, 3 stages; before pregather and warp specialisation):
    DeepSeek-like (64 experts top-8, H2048, F1408)  4.363 ms = 520 TFLOP/s: 5.3x a per-expert loop (23.1 ms),
        1.87x torch._grouped_mm with torch routing/SwiGLU/combine (8.17 ms); pointer kernels 4.865 ms
    Mixtral-like (8 experts top-2, H4096, F14336)  18.81 ms = 614 TFLOP/s: 1.16x the loop (21.74 ms), 1.15x
        grouped_mm + glue (21.57 ms); pointer kernels 21.48 ms
With pregather and warp-specialised GEMMs (the default), `crucible bench` (sustained; docs/results.md):
    DeepSeek-like 4.254 ms = 533.0 TFLOP/s, 4.00x the loop, 1.91x torch._grouped_mm + PyTorch glue
    Mixtral-like 17.96 ms = 642.9 TFLOP/s, 1.175x the loop, 1.18x torch._grouped_mm + glue (ANCHORS: >= 640, 1.15x)
The issue's 3x over a per-expert loop holds for many small experts only: with 8 large experts the loop already
runs at 531 TFLOP/s, and 3x would be twice the H200's bf16 peak.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from seeds.cross_entropy import needs_rne, round_bf16_rne
from seeds.moe import align_block_size, default_config, grouped_gemm

CRUCIBLE_SEED = {
    "name": "moe_layer",
    "tasks": ["moe_layer_mixtral.py", "moe_layer_deepseek.py"],
    "ops": ["MoE router: softmax top-k renormalised, sigmoid + bias top-k (DeepSeek-V3)",
            "fused MoE layer fwd: route, align, gate/up GEMM + SwiGLU, down GEMM, weighted combine"],
}


@triton.jit
def _router_kernel(
    LOGITS, BIAS, WEIGHTS, IDS,  # LOGITS [T, E]; BIAS [E] fp32 (SIGMOID only); out WEIGHTS [T, K] fp32, IDS [T, K]
    T, E, stride_l, routed_scale,
    TOP_K: tl.constexpr, SIGMOID: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    row_ok = rows < T
    mask = row_ok[:, None] & (cols[None, :] < E)
    logits = tl.load(LOGITS + rows[:, None].to(tl.int64) * stride_l + cols[None, :], mask=mask,
                     other=0.0).to(tl.float32)
    logits = tl.where(cols[None, :] < E, logits, -float("inf"))  # rows past T stay finite: no NaN to mask later
    if SIGMOID:
        scores = tl.sigmoid(logits)
        choice = scores + tl.load(BIAS + cols, mask=cols < E, other=0.0)[None, :]
    else:
        shifted = tl.exp(logits - tl.max(logits, axis=1)[:, None])
        scores = shifted / tl.sum(shifted, axis=1)[:, None]
        choice = scores
    choice = tl.where(mask, choice, -float("inf"))
    kcols = tl.arange(0, BLOCK_K)
    weights = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    ids = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int32)
    for k in tl.static_range(TOP_K):
        best = tl.max(choice, axis=1)
        pick = tl.min(tl.where(choice == best[:, None], cols[None, :], BLOCK_E), axis=1)  # lowest index on a tie
        hit = cols[None, :] == pick[:, None]
        weights = tl.where(kcols[None, :] == k, tl.sum(tl.where(hit, scores, 0.0), axis=1)[:, None], weights)
        ids = tl.where(kcols[None, :] == k, pick[:, None], ids)
        choice = tl.where(hit, -float("inf"), choice)
    weights = weights / tl.sum(weights, axis=1)[:, None] * routed_scale
    out = rows[:, None].to(tl.int64) * TOP_K + kcols[None, :]
    out_mask = row_ok[:, None] & (kcols[None, :] < TOP_K)
    tl.store(WEIGHTS + out, weights, mask=out_mask)
    tl.store(IDS + out, ids, mask=out_mask)


@triton.jit
def _combine_kernel(
    Y, WEIGHTS, OUT,  # Y [T*K, H] in (token, slot) order; WEIGHTS [T, K] fp32; OUT [T, H]
    T, H, stride_y, stride_o,
    TOP_K: tl.constexpr, RNE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = rows < T
    mask = row_ok[:, None] & (cols[None, :] < H)
    rows64 = rows.to(tl.int64)
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        w = tl.load(WEIGHTS + rows64 * TOP_K + k, mask=row_ok, other=0.0)
        y = tl.load(Y + (rows64 * TOP_K + k)[:, None] * stride_y + cols[None, :], mask=mask, other=0.0)
        acc += w[:, None] * y.to(tl.float32)
    if RNE:
        acc = round_bf16_rne(acc)
    tl.store(OUT + rows64[:, None] * stride_o + cols[None, :], acc.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _gather_rows_kernel(
    X, SORTED_IDS, NUM_PADDED, XS,  # XS[p] = X[SORTED_IDS[p] // ROW_DIV] for each routed position p < NUM_PADDED
    n_valid, H, stride_x, stride_xs,
    ROW_DIV: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
):
    pos = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ids = tl.load(SORTED_IDS + pos, mask=pos < tl.load(NUM_PADDED), other=n_valid)
    ok = ids < n_valid  # padding positions (the sentinel id) are left as they are: their rows are never stored
    src = (ids // ROW_DIV).to(tl.int64)
    dst = pos.to(tl.int64)
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        mask = ok[:, None] & (cols < H)[None, :]
        row = tl.load(X + src[:, None] * stride_x + cols[None, :], mask=mask)
        tl.store(XS + dst[:, None] * stride_xs + cols[None, :], row, mask=mask)


def gather_rows(x: torch.Tensor, layout, top_k: int) -> torch.Tensor:
    """x's routed rows in the layout's sorted order, [len(sorted_ids), H]: row p is x[sorted_ids[p] // top_k];
    rows of padding positions are left unwritten (the GEMMs never store what they compute from them)."""
    xs = torch.empty((layout.sorted_ids.numel(), x.shape[1]), dtype=x.dtype, device=x.device)
    block_h = min(256, max(16, triton.next_power_of_2(x.shape[1])))
    _gather_rows_kernel[(triton.cdiv(xs.shape[0], 16),)](
        x, layout.sorted_ids, layout.num_padded, xs, layout.n_valid, x.shape[1], x.stride(0), xs.stride(0),
        ROW_DIV=top_k, BLOCK_R=16, BLOCK_H=block_h, num_warps=4)
    return xs


def route(logits: torch.Tensor, top_k: int, scoring: str = "softmax", bias: torch.Tensor | None = None,
          routed_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, K] fp32, expert ids [T, K] int32) of router logits [T, E]."""
    if logits.dim() != 2:
        raise ValueError(f"route: expected logits [T, E], got {tuple(logits.shape)}")
    t, e = logits.shape
    if not 1 <= top_k <= e:
        raise ValueError(f"route: top_k must be in [1, {e}], got {top_k}")
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"route: scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    if scoring == "sigmoid" and (bias is None or bias.shape != (e,)):
        raise ValueError(f"route: sigmoid scoring needs a bias of shape [{e}]")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    block_e = max(16, triton.next_power_of_2(e))
    block_t = max(1, min(64, 4096 // block_e))
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=logits.device)
    if t:
        bias_f = bias.to(torch.float32).contiguous() if bias is not None else weights
        _router_kernel[(triton.cdiv(t, block_t),)](
            logits, bias_f, weights, ids, t, e, logits.stride(0), float(routed_scale), TOP_K=top_k,
            SIGMOID=scoring == "sigmoid", BLOCK_T=block_t, BLOCK_E=block_e,
            BLOCK_K=max(2, triton.next_power_of_2(top_k)), num_warps=4)
    return weights, ids


def combine(y: torch.Tensor, weights: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[t] = sum_k weights[t, k] * y[t*K + k] (fp32 sum, in slot order)."""
    t, top_k = weights.shape
    h = out.shape[1]
    if t and h:
        block_h = min(1024, max(16, triton.next_power_of_2(h)))
        _combine_kernel[(triton.cdiv(t, 4), triton.cdiv(h, block_h))](
            y, weights, out, t, h, y.stride(0), out.stride(0), TOP_K=top_k, RNE=needs_rne(out), BLOCK_T=4,
            BLOCK_H=block_h, num_warps=4)
    return out


def moe_layer_fwd(x: torch.Tensor, logits: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                  top_k: int, scoring: str = "softmax", bias: torch.Tensor | None = None, routed_scale: float = 1.0,
                  up_config=None, down_config=None, pregather: bool = True, **variant) -> torch.Tensor:
    """The MoE layer's output [T, H] (see the module docstring); configs as seeds.moe.grouped_gemm, one BLOCK_M;
    variant: both grouped GEMMs' impl / warp_specialize / flatten.
    pregather: copy x's routed rows into sorted order first (one gather of T K H elements), so the gate/up GEMM
    reads its A blocks as runs of rows (by TMA on a GPU) instead of gathering them by pointer loads.
    Default: pregather, and on a GPU (through TMA) both GEMMs warp-specialised. H200 (bench_moe.py --layers,
    do_bench): DeepSeek-like 555.9 TFLOP/s against 530.5 without either, Mixtral-like 652.6 against 624.2 (pregather
    alone 536.6 / 653.2; flattening the loop lost 10-25%)."""
    if x.dim() != 2 or w_gate_up.dim() != 3 or w_down.dim() != 3:
        raise ValueError(f"moe_layer: expected x [T, H], w_gate_up [E, 2F, H], w_down [E, H, F], got "
                         f"{tuple(x.shape)}, {tuple(w_gate_up.shape)}, {tuple(w_down.shape)}")
    t, hidden = x.shape
    experts, two_f, _ = w_gate_up.shape
    ffn = two_f // 2
    if w_gate_up.shape != (experts, 2 * ffn, hidden) or w_down.shape != (experts, hidden, ffn):
        raise ValueError(f"moe_layer: w_gate_up {tuple(w_gate_up.shape)} and w_down {tuple(w_down.shape)} do not "
                         f"fit x {tuple(x.shape)}")
    if logits.shape != (t, experts):
        raise ValueError(f"moe_layer: expected router logits [{t}, {experts}], got {tuple(logits.shape)}")
    up_config = up_config or default_config(x.device, swiglu=True)
    down_config = down_config or default_config(x.device)
    if up_config[0] != down_config[0]:
        raise ValueError("moe_layer: both grouped GEMMs walk one aligned layout, so they need one BLOCK_M")
    x = x.contiguous()
    if x.device.type == "cuda" and variant.get("impl", "auto") != "ptr":
        variant.setdefault("warp_specialize", True)
    weights, ids = route(logits, top_k, scoring, bias, routed_scale)
    layout = align_block_size(ids, experts, up_config[0])
    h = torch.empty((layout.sorted_ids.numel(), ffn), dtype=x.dtype, device=x.device)
    if pregather:
        xs = gather_rows(x, layout, top_k)
        grouped_gemm(xs, w_gate_up, layout, h, gather_a=False, scatter_c=False, swiglu=True, config=up_config,
                     **variant)
    else:
        grouped_gemm(x, w_gate_up, layout, h, a_row_div=top_k, gather_a=True, scatter_c=False, swiglu=True,
                     config=up_config, **variant)
    y = torch.empty((t * top_k, hidden), dtype=x.dtype, device=x.device)
    grouped_gemm(h, w_down, layout, y, gather_a=False, scatter_c=True, config=down_config, **variant)
    return combine(y, weights, torch.empty_like(x))


class ModelNew(torch.nn.Module):
    """tasks/moe_layer_mixtral.py and tasks/moe_layer_deepseek.py: the MoE layer forward from router logits."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int, scoring: str = "softmax",
                 routed_scale: float = 1.0):
        super().__init__()
        self.w_gate_up = torch.nn.Parameter(torch.empty(experts, 2 * ffn, hidden, dtype=torch.bfloat16))
        self.w_down = torch.nn.Parameter(torch.empty(experts, hidden, ffn, dtype=torch.bfloat16))
        if scoring == "sigmoid":
            self.register_buffer("router_bias", torch.zeros(experts, dtype=torch.float32))
        self.experts, self.top_k, self.scoring, self.routed_scale = experts, top_k, scoring, routed_scale

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        bias = self.router_bias if self.scoring == "sigmoid" else None
        return moe_layer_fwd(x, router_logits, self.w_gate_up.detach(), self.w_down.detach(), self.top_k,
                             self.scoring, bias, self.routed_scale)
